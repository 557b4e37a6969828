//! One TUI frame of the largest fixture (8 GPUs, 128 processes, 64 of them trainers, 8 leak
//! findings) per screen, and applying one snapshot of that size to the state.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use criterion::{criterion_group, criterion_main, Criterion};
use gpumon::frontends::tui::app::rows::Column;
use gpumon::frontends::tui::app::state::{Action, Screen, Update};
use gpumon::frontends::tui::fixtures;
use gpumon::frontends::tui::ui;
use ratatui::backend::TestBackend;
use ratatui::Terminal;

fn bench(c: &mut Criterion) {
    let screens: [(&str, Vec<Action>); 4] = [
        ("overview", vec![]),
        ("processes", vec![Action::Show(Screen::Processes)]),
        (
            "trainer",
            vec![
                Action::Show(Screen::Processes),
                Action::SortBy(Column::Findings),
                Action::Top,
                Action::Open,
            ],
        ),
        ("findings", vec![Action::Show(Screen::Findings)]),
    ];
    for (w, h) in [(160, 48), (80, 24)] {
        for (name, actions) in &screens {
            let mut app = fixtures::largest();
            app.update(Action::Resize {
                width: w,
                height: h,
            });
            for a in actions {
                app.update(a.clone());
            }
            assert_eq!(app.procs.rows.len(), 128);
            let mut term = Terminal::new(TestBackend::new(w, h)).unwrap();
            c.bench_function(
                &format!("tui_frame_{name}_{w}x{h}_8gpu_128proc_64trainers"),
                |b| {
                    b.iter(|| {
                        term.draw(|f| ui::render(f, &app)).unwrap();
                    });
                },
            );
        }
    }
    // What each refresh costs before drawing: history merge, findings, rows, sort.
    let app = fixtures::largest();
    let snap = app.nodes[0].snap.clone().unwrap();
    c.bench_function("tui_apply_snapshot_8gpu_128proc_64trainers", |b| {
        b.iter_batched(
            || (app.clone(), snap.clone()),
            |(mut app, mut s)| {
                s.ts += 1.0;
                app.update(Action::Data {
                    node: 0,
                    update: Update::Snapshot(Box::new(s)),
                });
                app
            },
            criterion::BatchSize::LargeInput,
        );
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
