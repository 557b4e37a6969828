#![allow(clippy::unwrap_used)]
use super::*;
use crate::core::jobs::verdict::{verdict, Basis, Rules};
use crate::core::jobs::view::Stray;
use crate::core::jobs::{Failure, Member};

fn member(r: u64, failure: Option<(Kind, f64)>) -> Member {
    Member {
        session: format!("s-{r}"),
        rank: Some(r),
        host: Some("node-a".into()),
        file: None,
        pid: 100 + r as u32,
        gpu_uuid: None,
        started: 0.0,
        ended: failure.map(|f| f.1),
        failure: failure.map(|(kind, ts)| Failure {
            kind,
            ts,
            step: Some(7),
            message: "CUDA out of memory\u{1b}[2J".into(),
            exception: None,
            signal: None,
        }),
        peak_bytes: Some((10 + r) << 30),
        headroom_bytes: None,
        oom_eta_seconds: None,
        findings: Vec::new(),
        stray: Vec::new(),
    }
}

fn job(basis: Basis) -> Job {
    let view = verdict(basis, &Rules::default());
    let live = view.members.iter().filter(|m| m.ended.is_none()).count();
    Job {
        view,
        live,
        active: true,
    }
}

fn text(lines: &[Line]) -> Vec<String> {
    lines.iter().map(|l| l.to_string()).collect()
}

#[test]
fn client_strings_are_shown_escaped_never_obeyed() {
    let j = job(Basis {
        job: "llama\u{1b}]0;pwned\u{7}".into(),
        run_id: Some("r\n1".into()),
        world_size: Some(2),
        conflicts: vec!["rank 9\u{1b}[2J is past world_size 2".into(); 3],
        members: vec![member(0, Some((Kind::Oom, 10.0))), member(1, None)],
        ..Basis::default()
    });
    let lines = text(&lines(&j, 200, 12.0, Theme::new(false)));
    let all = lines.join("\n");
    assert!(!all.chars().any(|c| c != '\n' && c.is_control()), "{all:?}");
    assert!(lines[0].starts_with("■ llama\\u{1b}]0;pwned\\u{7} (run r\\u{a}1) · 2/2 ranks"));
    assert!(
        all.contains("2s ago: CUDA out of memory\\u{1b}[2J"),
        "{all}"
    );
    assert!(all.contains("conflict: rank 9\\u{1b}[2J is past world_size 2"));
    assert!(all.contains("and 1 more conflict"), "{all}");
}

#[test]
fn every_line_fits_its_width_and_says_where_it_was_cut() {
    let mut members: Vec<Member> = (0..8).map(|r| member(r, None)).collect();
    members[3].failure = Some(Failure {
        kind: Kind::Oom,
        ts: 100.0,
        step: Some(812),
        message: "x".repeat(300),
        exception: None,
        signal: None,
    });
    members[3].ended = Some(100.0);
    for (r, m) in members.iter_mut().enumerate() {
        m.oom_eta_seconds = Some(600.0 + r as f64);
        m.headroom_bytes = Some(-(1 << 30));
        if r != 3 {
            m.ended = Some(101.5);
            m.failure = Some(Failure {
                kind: if r == 6 { Kind::Oom } else { Kind::Crash },
                ts: 101.0 + r as f64 * 0.05,
                step: None,
                message: String::new(),
                exception: None,
                signal: None,
            });
        }
    }
    let j = job(Basis {
        job: "a-job-with-a-rather-long-name-that-goes-on".into(),
        run_id: Some("torchelastic-0123456789abcdef".into()),
        world_size: Some(8),
        members,
        ..Basis::default()
    });
    for width in [30, 60, 78, 158] {
        let lines = lines(&j, width, 200.0, Theme::new(false));
        for l in &lines {
            assert!(l.width() <= width, "{width}: {l}");
        }
        assert!(lines.iter().any(|l| l.to_string().ends_with('…')));
    }
    let wide = text(&lines(&j, 400, 200.0, Theme::new(false)));
    assert!(
        wide.contains(&"  ↳ followed: 7 ranks (0-2,4-7) failed (crash, oom) within 1.3 s".into()),
        "{wide:#?}"
    );
}

#[test]
fn the_memory_line_leaves_out_whole_parts_that_do_not_fit() {
    let mut members: Vec<Member> = (0..4).map(|r| member(r, None)).collect();
    for m in &mut members {
        m.oom_eta_seconds = Some(840.0);
        m.headroom_bytes = Some(3 << 30);
        m.stray = vec![Stray {
            gpu_uuid: "GPU-0".into(),
            gpu: Some(0),
            bytes: 512 << 20,
        }];
    }
    let j = job(Basis {
        job: "j".into(),
        world_size: Some(4),
        members,
        ..Basis::default()
    });
    let t = Theme::new(false);
    let wide = memory(&j.view, 400, t).unwrap().to_string();
    assert_eq!(
        wide,
        "  OOM in ~14m (rank 0) · peaks 10.0 GiB–13.0 GiB, top rank 3 (median 12.0 GiB) · headroom 3.0 GiB (rank 0) · stray: ranks 0-3 on GPU 0 (2.0 GiB)"
    );
    let narrow = memory(&j.view, 78, t).unwrap().to_string();
    assert_eq!(
        narrow,
        "  OOM in ~14m (rank 0) · peaks 10.0 GiB–13.0 GiB, top rank 3 (median 12.0 GiB)"
    );
}

#[test]
fn a_lone_process_is_no_job_of_0_ranks() {
    let mut lone = member(0, Some((Kind::Crash, 10.0)));
    lone.rank = None;
    let j = job(Basis {
        job: "train".into(),
        members: vec![lone.clone()],
        ..Basis::default()
    });
    assert_eq!(j.view.state, JobState::Failed);
    let head = text(&lines(&j, 120, 12.0, Theme::new(false)))[0].clone();
    assert_eq!(head, "■ train · one process, no rank · failed");
    let mut other = lone.clone();
    other.session = "s-9".into();
    other.ended = None;
    other.failure = None;
    let two = job(Basis {
        job: "train".into(),
        members: vec![lone, other],
        ..Basis::default()
    });
    let head = text(&lines(&two, 120, 12.0, Theme::new(false)))[0].clone();
    assert!(head.contains("· 2 processes, no ranks ·"), "{head}");
    assert!(!head.contains("0 ranks"), "{head}");
}

#[test]
fn a_stopped_job_is_told_as_stopped_not_as_a_failure() {
    let mut ms: Vec<Member> = (0..3)
        .map(|r| member(r, Some((Kind::Stopped, 10.0 + r as f64 * 0.1))))
        .collect();
    for m in &mut ms {
        if let Some(f) = m.failure.as_mut() {
            f.message = "the trainer was stopped by SIGINT at step 7".into();
            f.signal = Some("SIGINT\u{1b}[2J".into());
        }
    }
    let j = job(Basis {
        job: "llama".into(),
        world_size: Some(3),
        members: ms,
        ..Basis::default()
    });
    let lines = text(&lines(&j, 200, 12.0, Theme::new(false)));
    let all = lines.join("\n");
    assert!(lines[0].ends_with("· stopped"), "{all}");
    assert!(
        lines[1].contains("■ stopped: rank 0 by SIGINT\\u{1b}[2J on node-a at step 7"),
        "{all}"
    );
    assert!(!all.contains('✗') && !all.contains("failed"), "{all}");
    assert!(
        all.contains("↳ followed: 2 ranks (1,2) stopped within 0.2 s"),
        "{all}"
    );
}

#[test]
fn a_failure_past_the_cascade_window_is_said_in_the_cores_words() {
    // Rank 0's OOM at 10 s, rank 1 down at 11.5 s, rank 2 at 105 s: past the 60 s window.
    let j = job(Basis {
        job: "llama".into(),
        run_id: Some("r1".into()),
        world_size: Some(3),
        members: vec![
            member(0, Some((Kind::Oom, 10.0))),
            member(1, Some((Kind::Crash, 11.5))),
            member(2, Some((Kind::Crash, 105.0))),
        ],
        ..Basis::default()
    });
    let want = crate::core::jobs::text::later_failures(&j.view.other_failures, LATER_SHOWN);
    let want = want.unwrap();
    assert_eq!(want, "failed past the cascade window: rank 2 crash +1m");
    let lines = text(&lines(&j, 200, 120.0, Theme::new(false)));
    assert!(lines.contains(&format!("  {want}")), "{lines:#?}");
}
