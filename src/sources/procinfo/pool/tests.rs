use super::*;

fn tree(pids: std::ops::Range<u32>) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for pid in pids {
        let p = dir.path().join(pid.to_string());
        std::fs::create_dir(&p).unwrap();
        std::fs::write(
            p.join("status"),
            format!("Name:\tp{pid}\nUid:\t{pid}\t0\t0\t0\n"),
        )
        .unwrap();
    }
    dir
}

/// Every pid is read once per prefetch, by the helpers or the caller, prefetch after
/// prefetch, and a helper that ended is started again.
#[test]
fn every_pid_is_read_once_and_ended_helpers_come_back() {
    let dir = tree(0..300);
    let mut reader = Reader::new(dir.path());
    let mut pool = Pool::new(3);
    for round in 0..6 {
        if round == 3 {
            // As if the first helper had ended for want of work.
            let (tx, rx) = mpsc::channel();
            drop(rx);
            pool.helpers[0] = Some(tx);
        }
        let pids: Vec<u32> = (0..300 + round).collect();
        let mut read = pool.read(dir.path(), &mut reader, pids.clone());
        read.sort_by_key(|(pid, _)| *pid);
        assert_eq!(read.iter().map(|(p, _)| *p).collect::<Vec<_>>(), pids);
        for (pid, files) in &read {
            let want = (*pid < 300).then_some(*pid);
            assert_eq!(files.uid, want, "round {round}");
        }
        assert!(pool.helpers.iter().all(Option::is_some));
    }
}
