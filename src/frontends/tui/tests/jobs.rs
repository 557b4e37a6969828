//! Trainers grouped by job on the Overview: a failed job names its first failure and what
//! followed it, a running one its memory across ranks and its findings as one; a job over two
//! daemons is one job, judged across both. The snapshots are filed with the other screens'.

use super::super::fixtures;
use super::{draw, screens, text, SIZES};

#[test]
fn jobs_on_the_overview() {
    screens("job_failed", fixtures::failed_job(), &[]);
    screens("job_leaking", fixtures::leaking_job(), &[]);
    screens("job_two_nodes", fixtures::two_node_job(0.0), &[]);
}

/// What must read at every size, whatever else is cut.
#[test]
fn the_first_failure_and_what_followed_read_at_every_size() {
    for (w, h) in SIZES {
        let screen = text(&draw(&mut fixtures::failed_job(), w, h));
        for part in [
            "■ llama-70b (run run-4127) · 8/8 ranks · failed",
            "✗ failed: rank 5 oom on node-a at step 812, then 7 ranks within 1.5 s",
            "↳ followed: 7 ranks (0-4,6,7) crashed within 1.5 s",
            " Trainers 0 · 1 job (1 failed) ",
        ] {
            assert!(screen.contains(part), "{w}x{h}: {part:?}\n{screen}");
        }
    }
}

#[test]
fn a_running_job_s_ranks_sit_under_it_with_its_memory() {
    let mut app = fixtures::leaking_job();
    let screen = text(&draw(&mut app, 160, 48));
    for part in [
        "■ llama-70b (run run-4128) · 8/8 ranks · running",
        "OOM in ~3h40m (rank 7) · peaks 46.6 GiB–50.1 GiB, top rank 7 (median 48.6 GiB)",
        "▲ leak on 8 of 8 ranks (0-7): allocated floor grows 2.0 MiB/step",
        "stray: ranks 1-7 on GPU 0 (3.5 GiB)",
    ] {
        assert!(screen.contains(part), "{part:?}\n{screen}");
    }
    // Every rank keeps its row, in rank order under the job, set in.
    let rows: Vec<&str> = screen
        .lines()
        .filter(|l| l.contains("llama-70b r") && l.contains(" · python"))
        .collect();
    assert_eq!(rows.len(), 8, "{screen}");
    for (r, l) in rows.iter().enumerate() {
        assert!(l.contains(&format!("│  llama-70b r{r}/8 · python")), "{l}");
    }
}

#[test]
fn two_daemons_show_one_job_with_the_earliest_failure_on_either() {
    let app = fixtures::two_node_job(0.0);
    // Node-a's daemon, alone, blames its first crash; the merged view names node-b's OOM.
    let alone = &app.nodes[0].snap.as_ref().unwrap().jobs[0];
    assert_eq!(alone.first_failure.as_ref().unwrap().rank, Some(0));
    assert_eq!(app.jobs.list.len(), 1);
    let v = &app.jobs.list[0].view;
    let f = v.first_failure.as_ref().unwrap();
    assert_eq!((f.rank, f.host.as_deref()), (Some(5), Some("node-b")));
    assert!(f.order_unknown.is_empty(), "{f:?}");
    assert_eq!(v.consequences.len(), 7);
    assert_eq!(v.hosts, ["node-a", "node-b"]);
    let screen = text(&draw(&mut fixtures::two_node_job(0.0), 160, 48));
    assert!(
        screen.contains("8/8 ranks on node-a, node-b · failed"),
        "{screen}"
    );
    assert!(
        screen.contains("✗ failed: rank 5 oom on node-b at step 812, then 7 ranks within 1.5 s"),
        "{screen}"
    );
}

#[test]
fn a_skewed_clock_says_order_unknown_rather_than_guessing() {
    let mut app = fixtures::two_node_job(2.0);
    assert_eq!(app.jobs.skewed, ["node-b"]);
    let f = app.jobs.list[0].view.first_failure.clone().unwrap();
    assert_eq!(f.order_unknown, [0, 1, 2, 3]);
    let screen = text(&draw(&mut app, 160, 48));
    assert!(
        screen.contains("(order unknown against ranks 0-3: clocks)"),
        "{screen}"
    );
}
