use super::*;
use crate::core::model::*;
use crate::core::store::{HistoryLimits, Store};

fn reading() -> NodeReading {
    let gpu = |index: u32, state| GpuReading {
        identity: GpuIdentity {
            index,
            uuid: format!("GPU-{index}"),
            name: "NVIDIA H100 80GB HBM3".into(),
            pci_bus_id: format!("00000000:{index:02X}:00.0"),
        },
        state,
        error: None,
        memory: (state == GpuState::Ok).then_some(MemoryInfo {
            total: 1000,
            used: 300,
            free: 600,
            reserved: 100,
        }),
        utilization: Some(0.5),
        temperature_celsius: None,
        power_watts: Some(120.5),
        mig_mode: false,
        mig_devices: vec![],
        unified: None,
    };
    let process = |pid, used| ProcessReading {
        gpu: 0,
        uuid: "GPU-0".into(),
        pid,
        kind: ProcessKind::Compute,
        used_memory_bytes: used,
        mig_uuid: None,
        gpu_instance_id: None,
        compute_instance_id: None,
        info: ProcInfo {
            name: Some("python".into()),
            ..ProcInfo::default()
        }
        .into(),
    };
    NodeReading {
        ts: 1.0,
        driver_version: Some("550.54.15".into()),
        gpus: vec![gpu(0, GpuState::Ok), gpu(1, GpuState::Lost)],
        processes: vec![process(10, Some(200)), process(11, None)],
    }
}

fn render(store: Store) -> String {
    Exporter::of_store(&store, Default::default())
        .unwrap()
        .render()
}

fn new_store() -> Store {
    Store::new(HistoryLimits { gpu_points: 4 }, 1.0, "lib".into())
}

#[test]
fn renders_gpu_and_process_series_with_contract_labels() {
    let mut store = new_store();
    store.apply(reading(), 0.002);
    let text = render(store);
    for line in [
        "gpumon_nvml_up 1",
        "gpumon_nvml_poll_duration_seconds 0.002",
        r#"gpumon_gpu_memory_used_bytes{gpu="0",uuid="GPU-0"} 300"#,
        r#"gpumon_gpu_memory_reserved_bytes{gpu="0",uuid="GPU-0"} 100"#,
        r#"gpumon_gpu_utilization_ratio{gpu="0",uuid="GPU-0"} 0.5"#,
        r#"gpumon_gpu_power_watts{gpu="0",uuid="GPU-0"} 120.5"#,
        r#"gpumon_gpu_up{gpu="1",uuid="GPU-1"} 0"#,
        r#"gpumon_gpu_info{gpu="0",uuid="GPU-0",name="NVIDIA H100 80GB HBM3",pci_bus_id="00000000:00:00.0",driver_version="550.54.15"} 1"#,
        r#"gpumon_process_memory_used_bytes{gpu="0",uuid="GPU-0",pid="10",process="python",container=""} 200"#,
        "# TYPE gpumon_nvml_polls_total counter",
    ] {
        assert!(text.contains(line), "missing {line:?} in\n{text}");
    }
    assert!(text.contains("gpumon_build_info{"), "{text}");
    // Not available is absent, never 0; unsupported temperature renders no family at all.
    assert!(
        !text.contains(r#"pid="11",process="python",uuid="GPU-0"} 0"#),
        "{text}"
    );
    assert!(
        text.contains(r#"pid="11""#),
        "process 11 keeps its info series"
    );
    assert!(!text.contains("gpumon_gpu_temperature_celsius"), "{text}");
    // The lost GPU has no memory series.
    assert!(
        !text.contains(r#"gpumon_gpu_memory_used_bytes{gpu="1""#),
        "{text}"
    );
}

#[test]
fn nvml_down_renders_only_health() {
    let mut store = new_store();
    store.apply(reading(), 0.0);
    store.apply_failure(2.0, "gone".into(), 0.0);
    let text = render(store);
    assert!(text.contains("gpumon_nvml_up 0"), "{text}");
    assert!(text.contains("gpumon_nvml_poll_errors_total 1"), "{text}");
    assert!(!text.contains("gpumon_gpu_memory"), "{text}");
    assert!(!text.contains("gpumon_process_memory"), "{text}");
}

#[test]
fn two_live_sessions_with_one_label_set_export_the_newest_once() {
    use crate::core::trainer::Peer;
    use crate::core::trainer::{Hello, Sample, Stats};
    let mut store = new_store();
    store.apply(reading(), 0.002);
    let peer = Peer {
        pid: 10,
        uid: 1000,
        gid: 1000,
    };
    let hello = Hello {
        v: 1,
        job: Some("j".into()),
        rank: Some(0),
        gpu_uuid: Some("GPU-0".into()),
        ..Hello::default()
    };
    // A reconnect whose new hello arrived before the old connection was seen closing.
    for (i, allocated) in [111u64, 222].into_iter().enumerate() {
        let (key, _) = store.open(peer, hello.clone(), 1.0 + i as f64);
        let sample = Sample {
            ts: 2.0,
            step: Some(1),
            phase: "train".into(),
            stats: Stats {
                allocated: Some(allocated),
                ..Stats::default()
            },
            device_free: None,
            device_total: None,
            alloc_limit: None,
            categories: None,
        };
        store.sessions.sample(key, sample, 2.0);
    }
    let text = render(store);
    let series = |name: &str| {
        text.lines()
            .filter(|l| l.starts_with(&format!("{name}{{")))
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    assert_eq!(series("gpumon_trainer_info").len(), 2, "{text}");
    let allocated = series("gpumon_trainer_allocated_bytes");
    assert_eq!(allocated.len(), 1, "{allocated:?}");
    assert!(allocated[0].ends_with(" 222"), "the newest: {allocated:?}");
    assert_eq!(series("gpumon_leak_suspected").len(), 1);
    assert!(
        text.contains("gpumon_trainer_sessions_shadowed 1"),
        "{text}"
    );
}

/// `job` and `instance` are the labels Prometheus sets on every target: a series carrying either
/// loses it to `exported_*` under the default scrape settings, so none may.
#[test]
fn no_series_carries_a_label_prometheus_sets_on_targets() {
    use crate::core::trainer::Peer;
    use crate::core::trainer::{Hello, Sample, Stats};
    let mut store = new_store();
    store.apply(reading(), 0.002);
    let peer = Peer {
        pid: 10,
        uid: 1000,
        gid: 1000,
    };
    let hello = Hello {
        v: 1,
        job: Some("llama".into()),
        run_id: Some("r1".into()),
        rank: Some(3),
        world_size: Some(8),
        gpu_uuid: Some("GPU-0".into()),
        ..Hello::default()
    };
    let (key, _) = store.open(peer, hello, 1.0);
    let sample = Sample {
        ts: 2.0,
        step: Some(1),
        phase: "train".into(),
        stats: Stats {
            allocated: Some(1),
            ..Stats::default()
        },
        device_free: None,
        device_total: None,
        alloc_limit: None,
        categories: None,
    };
    store.sessions.sample(key, sample, 2.0);
    let text = render(store);
    let mut labelled = 0;
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((_, rest)) = line.split_once('{') else {
            continue;
        };
        labelled += 1;
        let names: Vec<&str> = rest
            .split(['{', ','])
            .filter_map(|kv| kv.split_once('=').map(|(k, _)| k.trim()))
            .collect();
        assert!(
            !names.contains(&"job") && !names.contains(&"instance"),
            "{line}"
        );
    }
    assert!(labelled > 0, "{text}");
    for family in ["gpumon_trainer_info", "gpumon_job_info"] {
        assert!(
            text.lines()
                .any(|l| l.starts_with(&format!("{family}{{")) && l.contains(r#"job_name="llama""#)),
            "{family} names the trainer's job in job_name: {text}"
        );
    }
}

#[test]
fn each_collection_is_deflated_ahead_once_a_gzip_scrape_came() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let view = |collection: u64| {
        Arc::new(View {
            collection,
            gpu_text: Arc::from(format!("# collection {collection}\n")),
            ..View::default()
        })
    };
    let (tx, rx) = watch::channel(view(1));
    let exporter = Arc::new(Exporter::new(rx, Vec::new()).unwrap());
    let cached = |e: &Exporter| e.gzip.lock().unwrap().as_ref().map(|(c, _)| *c);
    rt.block_on(async {
        let task = tokio::spawn(exporter.clone().compress_each_collection());
        // No gzip scrape yet: nothing is compressed ahead.
        tx.send(view(2)).unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert_eq!(cached(&exporter), None);
        exporter.render_gzip().unwrap();
        assert_eq!(cached(&exporter), Some(2));
        // From then on each new collection is deflated as it arrives, before any scrape.
        tx.send(view(3)).unwrap();
        for _ in 0..100 {
            if cached(&exporter) == Some(3) {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        assert_eq!(cached(&exporter), Some(3));
        task.abort();
    });
}

/// The text `Family` writes is what the prometheus crate's encoder writes for the same family:
/// the library stays the oracle for the format.
#[test]
fn family_text_is_the_library_encoding() {
    use prometheus::proto::{Counter, Gauge, LabelPair, Metric, MetricFamily, MetricType};
    const LABELS: &[&str] = &["gpu", "process", "namespace"];
    let series: &[(&[&str], f64)] = &[
        (&["0", "python", "ml"], 1.0),
        (&["1", "say \"hi\"\\back\nline", ""], 268435456.0),
        (&["2", "", ""], 0.5),
        (&["3", "x", "y"], f64::NAN),
        (&["4", "x", "y"], f64::INFINITY),
        (&["5", "x", "y"], -1e-7),
        (&["6", "ü", "y"], 1.8446744073709552e19),
    ];
    for (kind, proto) in [
        (Kind::Gauge, MetricType::GAUGE),
        (Kind::Counter, MetricType::COUNTER),
    ] {
        for help in ["GPU memory \\ used,\nin bytes \"quoted\".", ""] {
            let mut f = Family::new("gpumon_test", help, kind, LABELS);
            let mut mf = MetricFamily::default();
            mf.set_name("gpumon_test".into());
            mf.set_help(help.into());
            mf.set_field_type(proto);
            for (values, v) in series {
                f.add(values, *v);
                let mut m = Metric::default();
                let pairs = LABELS
                    .iter()
                    .zip(values.iter())
                    .filter(|(n, v)| !(v.is_empty() && **n == "namespace"))
                    .map(|(n, v)| {
                        let mut lp = LabelPair::default();
                        lp.set_name(n.to_string());
                        lp.set_value(v.to_string());
                        lp
                    })
                    .collect();
                m.set_label(pairs);
                if kind == Kind::Counter {
                    let mut c = Counter::default();
                    c.set_value(*v);
                    m.set_counter(c);
                } else {
                    let mut g = Gauge::default();
                    g.set_value(*v);
                    m.set_gauge(g);
                }
                mf.mut_metric().push(m);
            }
            let mut ours = String::new();
            f.finish(&mut ours);
            assert_eq!(ours, encode(&[mf]));
        }
    }
    // Without labels, and without series (left out).
    let mut f = Family::gauge("gpumon_up", "Up.", &[]);
    f.add(&[], 1.0);
    let mut ours = String::new();
    f.finish(&mut ours);
    assert_eq!(
        ours,
        "# HELP gpumon_up Up.\n# TYPE gpumon_up gauge\ngpumon_up 1\n"
    );
    Family::gauge("gpumon_none", "None.", &[]).finish(&mut ours);
    assert!(!ours.contains("gpumon_none"));
}

/// The memory split of a trainer that sent one: a series per category with the trainer's labels
/// (empty container, namespace and pod left out), `other` the peak less the rest, the batch and
/// the largest safe batch, the same figure the API's session view gives. A trainer whose split
/// could not measure activations has no activations series; one without a split has none.
#[test]
fn a_split_exports_memory_by_category_and_the_largest_safe_batch() {
    use crate::core::categories::Categories;
    use crate::core::detect::DetectConfig;
    use crate::core::store::sessions::{SessionLimits, Sessions};
    use crate::core::trainer::{Hello, Peer, Sample, Stats};
    let mut store = new_store();
    // Byte counts in thousands: near_limit's margin (which the fit keeps too) scaled to them.
    store.set_sessions(
        Sessions::new(SessionLimits::default()).with_detect(DetectConfig {
            headroom_margin_bytes: 512,
            ..DetectConfig::default()
        }),
    );
    store.apply(reading(), 0.002);
    let mut ids = Vec::new();
    for (pid, job, partial) in [
        (10, "measured", vec![]),
        (
            11,
            "no-activations",
            vec!["activations_unmeasured: hooks in the way".to_string()],
        ),
        (12, "no-split", vec![]),
    ] {
        let peer = Peer {
            pid,
            uid: 1000,
            gid: 1000,
        };
        let hello = Hello {
            v: 1,
            job: Some(job.into()),
            rank: Some(0),
            gpu_uuid: Some("GPU-0".into()),
            ..Hello::default()
        };
        let (key, _) = store.open(peer, hello, 1.0);
        ids.push(store.sessions.live_session(key).unwrap().id.clone());
        // A client that could not measure activations sends 0 for them, and says why.
        let activations_bytes = if partial.is_empty() { 12000 } else { 0 };
        let categories = (job != "no-split").then(|| {
            Box::new(Categories {
                step: 3,
                parameters_bytes: 4000,
                gradients_bytes: 4000,
                optimizer_state_bytes: 8000,
                buffers_bytes: 16,
                activations_bytes,
                batch_size: Some(32),
                fp32_bytes: None,
                partial,
            })
        });
        let sample = Sample {
            ts: 2.0,
            step: Some(3),
            phase: "train".into(),
            stats: Stats {
                allocated: Some(20_000),
                allocated_peak: Some(30_000),
                reserved: Some(32_000),
                ..Stats::default()
            },
            device_free: Some(2_000),
            device_total: Some(40_000),
            alloc_limit: None,
            categories,
        };
        store.sessions.sample(key, sample, 2.0);
    }
    let views: Vec<_> = ids
        .iter()
        .map(|id| crate::core::snapshot::SessionView::lookup(&store, id).unwrap())
        .collect();
    let text = render(store);
    let series = |name: &str| {
        text.lines()
            .filter(|l| l.starts_with(&format!("{name}{{")))
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    let labels = |pid: u32, job: &str| {
        format!(r#"gpu="0",uuid="GPU-0",pid="{pid}",job_name="{job}",rank="0""#)
    };
    let measured = labels(10, "measured");
    // Limit 34,000 (free + reserved), margin a twentieth: (32,300 - 16,016) / 437 per sample.
    assert_eq!(views[0].largest_safe_batch, Some(37));
    let want: Vec<String> = [
        ("parameters", 4000),
        ("gradients", 4000),
        ("optimizer_state", 8000),
        ("buffers", 16),
        ("activations", 12000),
        ("other", 1984),
    ]
    .iter()
    .map(|(c, v)| format!(r#"gpumon_trainer_memory_bytes{{{measured},category="{c}"}} {v}"#))
    .chain(
        ["parameters", "gradients", "optimizer_state", "buffers"]
            .iter()
            .zip([4000, 4000, 8000, 16])
            .map(|(c, v)| {
                format!(
                    r#"gpumon_trainer_memory_bytes{{{},category="{c}"}} {v}"#,
                    labels(11, "no-activations")
                )
            }),
    )
    // Activations unmeasured: the peak less what was named, activations among it.
    .chain([format!(
        r#"gpumon_trainer_memory_bytes{{{},category="other"}} 13984"#,
        labels(11, "no-activations")
    )])
    .collect();
    assert_eq!(series("gpumon_trainer_memory_bytes"), want, "{text}");
    assert_eq!(
        series("gpumon_trainer_batch_size"),
        [
            format!("gpumon_trainer_batch_size{{{measured}}} 32"),
            format!(
                "gpumon_trainer_batch_size{{{}}} 32",
                labels(11, "no-activations")
            ),
        ]
    );
    // Without activations the fit cannot scale the batch: no figure, as in the API.
    assert_eq!(views[1].largest_safe_batch, None);
    assert_eq!(
        series("gpumon_trainer_largest_safe_batch"),
        [format!(
            "gpumon_trainer_largest_safe_batch{{{measured}}} 37"
        )]
    );
    assert!(text.contains("# TYPE gpumon_trainer_memory_bytes gauge\n"));
    assert!(text.contains("# TYPE gpumon_trainer_largest_safe_batch gauge\n"));
}
