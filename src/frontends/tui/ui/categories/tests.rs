use super::*;
use crate::core::categories::{Budget, Categories, Tracker};
use crate::frontends::tui::fixtures;

const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;

fn plain(lines: &[Line]) -> Vec<String> {
    lines.iter().map(|l| l.to_string()).collect()
}

fn c(batch: Option<u64>, activations: u64) -> Categories {
    Categories {
        fp32_bytes: None,
        ..crate::core::categories::example(batch, activations)
    }
}

/// A session with the splits taken in order (each at a step peak), fitted under `limit`.
fn session(splits: &[(Categories, u64)], limit: u64) -> SessionView {
    let mut s = fixtures::trainer("s-1", 1, 0, ("j", 0), 1..=3, |_| 4 * GIB);
    let mut tracker = Tracker::default();
    for (c, peak) in splits {
        tracker.take(c.clone(), 0.0, Some(*peak));
    }
    s.batch_fit = tracker.fit(Budget {
        limit: Some(limit),
        ..Budget::default()
    });
    s.largest_safe_batch = s.batch_fit.as_ref().map(|f| f.largest_safe_batch);
    s.categories = tracker.latest().cloned();
    s
}

/// 1 + 1 + 2 GiB fixed, 4 GiB of activations at batch 16 and 1.6 GiB of other: a 9.6 GiB peak.
fn brief(limit: u64) -> SessionView {
    let peak = 9 * GIB + 614 * MIB;
    session(&[(c(Some(16), 4 * GIB), peak)], limit)
}

#[test]
fn nothing_without_a_split() {
    let mut s = brief(16 * GIB);
    s.categories = None;
    assert!(lines(&s, 160, Theme::new(false)).is_empty());
}

#[test]
fn one_line_of_sizes_and_bar_and_one_of_the_batch_when_wide() {
    let out = plain(&lines(&brief(10 * GIB), 160, Theme::new(false)));
    assert_eq!(out.len(), 2, "{out:#?}");
    assert!(
        out[0].starts_with(
            "split at step 3, peak 9.6 GiB  █ parameters 1.0 GiB  ▓ gradients 1.0 GiB  \
             ▒ optimizer state 2.0 GiB  ░ activations 4.0 GiB  ▪ other 1.6 GiB  "
        ),
        "{out:#?}"
    );
    // The bar takes the rest of the line, each part in proportion: 1 : 1 : 2 : 4 : 1.6.
    let bar: String = out[0].rsplit("  ").next().unwrap().to_string();
    assert_eq!(out[0].chars().count(), 160, "{out:#?}");
    assert_eq!(bar, "██▓▓▒▒▒▒░░░░░░░░▪▪▪");
    // Budget 9.5 GiB: (9.5 - 4) / (5.6 / 16) = 15.7.
    assert_eq!(out[1], "batch 16 now · 15 fits (scaled from batch 16)");
}

#[test]
fn a_fit_on_several_batches_says_on_which_and_how_close() {
    let splits: Vec<(Categories, u64)> = [(8, 2 * GIB), (12, 3 * GIB + 100 * MIB), (16, 4 * GIB)]
        .into_iter()
        .map(|(b, a)| (c(Some(b), a), 4 * GIB + a + a / 4))
        .collect();
    let s = session(&splits, 79 * GIB);
    let out = plain(&lines(&s, 160, Theme::new(false)));
    let fit = s.batch_fit.as_ref().unwrap();
    let pct = (fit.max_error_ratio.unwrap() * 100.0).ceil();
    assert_eq!(
        out[1],
        format!(
            "batch 16 now · {} fits (fitted on batches 8, 12 and 16, within {pct:.0}%)",
            thousands(fit.largest_safe_batch)
        )
    );
    // Past four batch sizes, their range.
    let many: Vec<(Categories, u64)> = (1..=6)
        .map(|k| (c(Some(4 * k), k * GIB), 4 * GIB + k * GIB))
        .collect();
    let out = plain(&lines(&session(&many, 79 * GIB), 160, Theme::new(false)));
    assert!(
        out[1].contains("fitted on 6 batch sizes, 4\u{2013}24, within 0%"),
        "{out:#?}"
    );
}

#[test]
fn no_batch_fits_says_what_does_not_scale() {
    let out = plain(&lines(&brief(4 * GIB), 160, Theme::new(false)));
    assert_eq!(
        out[1],
        "batch 16 now · no batch fits (4.0 GiB does not scale with the batch, of 4.0 GiB)"
    );
}

#[test]
fn a_batch_without_a_fit_says_so() {
    // No peak in the sample: no other, no fit.
    let mut s = session(&[(c(Some(16), 4 * GIB), 0)], 16 * GIB);
    if let Some(x) = s.categories.as_mut() {
        x.peak_bytes = None;
        x.other_bytes = None;
    }
    s.batch_fit = None;
    s.largest_safe_batch = None;
    let out = plain(&lines(&s, 160, Theme::new(false)));
    assert!(
        out[0].starts_with("split at step 3  █ parameters"),
        "{out:#?}"
    );
    assert!(!out[0].contains("other"), "{out:#?}");
    assert_eq!(out[1], "batch 16 now · what fits is not known");
}

/// Reasons come from the trainer: escaped, never obeyed; whole when they fit, else their codes.
#[test]
fn partial_reasons_are_escaped_and_cut_to_their_codes_when_narrow() {
    let mut x = c(None, 0);
    x.partial = vec![
        "no_grad_forward: nothing\u{1b}[2J saved".into(),
        "zero3\u{7}_partitions: 96 parameters are partitions".into(),
    ];
    let s = session(&[(x, 6 * GIB)], 16 * GIB);
    let out = plain(&lines(&s, 160, Theme::new(false)));
    assert_eq!(out.len(), 2, "{out:#?}");
    assert!(out[0].contains("░ activations not measured"), "{out:#?}");
    assert_eq!(
        out[1],
        "partial: no_grad_forward: nothing\\u{1b}[2J saved; zero3\\u{7}_partitions: 96 parameters are partitions"
    );
    let out = plain(&lines(&s, 60, Theme::new(false)));
    assert_eq!(
        out.last().unwrap(),
        "partial: no_grad_forward, zero3\\u{7}_partitions"
    );
    for l in &out {
        assert!(!l.chars().any(|c| c.is_control()), "{l:?}");
    }
}

#[test]
fn the_batch_and_partial_share_a_line_when_they_fit() {
    let mut x = c(Some(16), 4 * GIB);
    x.partial = vec!["dtensor_local: local shards counted".into()];
    let s = session(&[(x, 9 * GIB + 614 * MIB)], 10 * GIB);
    let out = plain(&lines(&s, 160, Theme::new(false)));
    assert_eq!(
        out[1],
        "batch 16 now · 15 fits (scaled from batch 16) · partial: dtensor_local: local shards counted"
    );
    let out = plain(&lines(&s, 70, Theme::new(false)));
    assert_eq!(
        out[out.len() - 2],
        "batch 16 now · 15 fits (scaled from batch 16)"
    );
    assert_eq!(
        out[out.len() - 1],
        "partial: dtensor_local: local shards counted"
    );
}

/// Every line fits its width at every width, the bar on its own line when the sizes leave it
/// no room, and nothing breaks at the narrowest.
#[test]
fn every_line_fits_its_width() {
    let mut x = c(Some(16), 4 * GIB);
    x.buffers_bytes = 64 * MIB;
    x.partial = vec!["zero3_partitions: 96 parameters are DeepSpeed ZeRO-3 partitions".into()];
    let s = session(&[(x, 9 * GIB + 614 * MIB)], 10 * GIB);
    for w in 0..200u16 {
        let ls = lines(&s, w, Theme::new(true));
        for l in &ls {
            assert!(l.width() <= usize::from(w), "{w}: {l}");
        }
    }
    let narrow = plain(&lines(&s, 78, Theme::new(false)));
    assert_eq!(
        narrow,
        [
            "split at step 3, peak 9.6 GiB  ████▓▓▓▓▒▒▒▒▒▒▒▒▚░░░░░░░░░░░░░░░░░▪▪▪▪▪▪",
            "█ params 1.0 GiB  ▓ grads 1.0 GiB  ▒ optim 2.0 GiB  ▚ buffers 64.0 MiB",
            "░ act 4.0 GiB  ▪ other 1.5 GiB",
            "batch 16 now · 15 fits (scaled from batch 16)",
            "partial: zero3_partitions: 96 parameters are DeepSpeed ZeRO-3 partitions",
        ]
    );
}

/// Each part has its own hue with colour and none without; the glyphs tell them apart either way.
#[test]
fn parts_differ_in_hue_and_glyph_and_no_color_means_no_colour() {
    use ratatui::style::Color;
    let mut x = c(Some(16), 4 * GIB);
    x.buffers_bytes = 64 * MIB;
    let s = session(&[(x, 9 * GIB + 614 * MIB)], 10 * GIB);
    let bar_hues = |color: bool| -> Vec<(String, Option<Color>)> {
        let ls = lines(&s, 200, Theme::new(color));
        ls[0]
            .spans
            .iter()
            .filter(|sp| {
                GLYPHS
                    .iter()
                    .any(|g| sp.content.starts_with(g) && !sp.content.contains(' '))
            })
            .map(|sp| (sp.content.chars().take(1).collect(), sp.style.fg))
            .collect()
    };
    let coloured = bar_hues(true);
    assert_eq!(coloured.len(), 6, "{coloured:?}");
    let mut hues: Vec<_> = coloured.iter().map(|(_, c)| format!("{c:?}")).collect();
    hues.dedup();
    assert_eq!(hues.len(), 6, "{coloured:?}");
    assert!(coloured.iter().all(|(_, c)| c.is_some()));
    for l in lines(&s, 200, Theme::new(false)) {
        for sp in &l.spans {
            assert!(sp.style.fg.is_none() && sp.style.bg.is_none(), "{sp:?}");
        }
    }
}
