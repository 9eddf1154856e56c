//! Maps the spin model of the run protocol (`spec/model/load_run.pml`) to the ledger that
//! implements it, and fails when the two drift apart: when the ledger gains an operation, an event
//! or a status that the model lacks, when a model transition names nothing in the ledger, or when
//! an operation writes an event its model transitions do not. scripts/model-check runs spin on the
//! model; docs/model.md explains both.
use ledger::{DispatchStatus, PartitionStatus, RunStatus};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Ledger operations with no transition of the protocol, and why the model does without them.
const OUTSIDE_THE_MODEL: &[(&str, &str)] = &[
    ("list_runs", "read-only"),
    ("run_detail", "read-only"),
    ("run_events", "read-only"),
    ("metrics", "read-only"),
    ("monitor_summary", "read-only"),
    ("cleanup_candidates", "read-only"),
    ("backlog_gauges", "read-only (gauges need no fence)"),
    ("job_summary", "read-only"),
    (
        "mirrored_runs_page",
        "read-only (the operator's LoadRun mirror)",
    ),
    (
        "mirrored_runs_by_id",
        "read-only (the operator's LoadRun mirror)",
    ),
    ("current_epoch", "read-only"),
    (
        "store_metrics",
        "writes metric rows and the run heartbeat, never a status; the model's judgements \
         (stage_validated, succeed) pass, a failing judgement changes nothing",
    ),
    (
        "record_cleanup",
        "sets the cleanup marker of a terminal run, which guarantee 13 allows; no status changes",
    ),
    (
        "apply_job",
        "per-job thresholds and suspend: the model lets every threshold expire at any moment",
    ),
    ("remove_job", "per-job settings only"),
    (
        "loadjob_owned_jobs",
        "read-only (the mirror's orphan check)",
    ),
    (
        "sweep",
        "one tick; each of its rules is mapped on its own as sweep.<rule>",
    ),
    (
        "sweep.stale_alert",
        "writes an alert event, no state change",
    ),
    (
        "sweep.event_retention",
        "deletes old events of cleaned-up runs, no state change",
    ),
    (
        "check_owner",
        "read-only (readiness: which installation owns the ledger)",
    ),
    (
        "refresh_owner",
        "refreshes the installation's claim on the ledger (fenced), no run state; the claim \
         itself is taken inside the epoch bump, which the model's leadership covers",
    ),
    (
        "sweep_history",
        "deletes cleaned-up terminal runs past history_retention with all their rows (and old \
         run-less events); a deleted run has no transition left, no state change",
    ),
];

/// Events written by operations outside the model.
const EVENTS_OUTSIDE_THE_MODEL: &[(&str, &str)] = &[
    ("RUN_CLEANED", "record_cleanup"),
    ("RUN_STALE_ALERT", "sweep.stale_alert"),
];

/// A guard of the protocol: the model's mutant that removes it, the property that spin must see
/// fire without it (scripts/model-check), and the ledger code that implements it, as fragments of
/// the named functions of `ledger/src/ops` (whitespace-insensitive). Changing one of these
/// conditions in the ledger fails `every_model_guard_is_the_ledger_code_that_implements_it`
/// until the model, its mutant and this table say the same again.
struct Guard {
    mutant: &'static str,
    property: &'static str,
    code: &'static [(&'static str, &'static str)],
}

const GUARDS: &[Guard] = &[
    Guard {
        mutant: "MUTANT_NO_TOKEN_CHECK",
        property: "4",
        code: &[
            (
                "report_chunk_once",
                "if part.claim_token != Some(r.claim_token) {",
            ),
            (
                "report_chunk_once",
                "return Err(LedgerError::ClaimMismatch)",
            ),
            (
                "partition_succeeded",
                "WHERE run_id = $1 AND partition_id = $2 AND status = 'RUNNING' AND claim_token = $3",
            ),
        ],
    },
    Guard {
        mutant: "MUTANT_NO_INVALIDATE",
        property: "4",
        code: &[(
            "rule_stale_partitions",
            "UPDATE nifi_ops.load_file SET status = 'FAILED', updated_at = clock_timestamp() \
             WHERE run_id = $1 AND partition_id = $2 AND status = 'WRITTEN'",
        )],
    },
    Guard {
        mutant: "MUTANT_NO_PIN",
        property: "6-at-least-one",
        code: &[
            (
                "partition_succeeded",
                "WHERE run_id = $1 AND partition_id > $2 AND status IN ('PENDING', 'RUNNING', 'RETRY') \
                 ORDER BY partition_id LIMIT 1 FOR KEY SHARE SKIP LOCKED",
            ),
            (
                "partition_succeeded",
                "WHERE run_id = $1 AND partition_id < $2 AND status IN ('PENDING', 'RUNNING', 'RETRY') \
                 AND NOT EXISTS (SELECT 1 FROM after) \
                 ORDER BY partition_id LIMIT 1 FOR KEY SHARE SKIP LOCKED",
            ),
            ("partition_succeeded", "if pinned { return Ok(()); }"),
            (
                "complete_extraction",
                "WHERE r.run_id = $1 AND r.status = 'EXTRACTING' \
                 AND p.n = r.expected_partition_count AND p.ok = r.expected_partition_count",
            ),
        ],
    },
    // spec/model/completion.pml: the pin's lock (a pinned sibling's report waits for this
    // success to commit) ...
    Guard {
        mutant: "MUTANT_PIN_WITHOUT_LOCK",
        property: "completion-at-least-once",
        code: &[
            (
                "partition_succeeded",
                "ORDER BY partition_id LIMIT 1 FOR KEY SHARE SKIP LOCKED",
            ),
            ("lock_partition", "FOR UPDATE"),
        ],
    },
    // ... and the recount in a statement of its own, after the wait for the run row.
    Guard {
        mutant: "MUTANT_STALE_RECOUNT",
        property: "completion-at-least-once",
        code: &[
            (
                "partition_succeeded",
                "SELECT status FROM nifi_ops.load_run WHERE run_id = $1 AND status = 'EXTRACTING' FOR NO KEY UPDATE",
            ),
            (
                "partition_succeeded",
                "if complete_extraction(conn, run).await? {",
            ),
        ],
    },
    // ... and, with release 0.1.0's successes beside this release's (a rolling upgrade, a
    // rollback), the trigger that makes 0.1.0's increment of `success_partition_count` return
    // the count of SUCCESS partitions ...
    Guard {
        mutant: "MUTANT_NO_TRIGGER",
        property: "completion-at-least-once",
        code: &[(
            "migrations/20261203000010_success_count_recount.sql",
            "BEFORE UPDATE OF success_partition_count ON nifi_ops.load_run \
             FOR EACH ROW \
             WHEN (NEW.success_partition_count IS DISTINCT FROM OLD.success_partition_count \
                   AND NEW.status = 'EXTRACTING') \
             EXECUTE FUNCTION nifi_ops.load_run_success_recount();",
        )],
    },
    // ... counting from a snapshot of its own, taken after the update won the run row.
    Guard {
        mutant: "MUTANT_TRIGGER_STABLE",
        property: "completion-at-least-once",
        code: &[(
            "migrations/20261203000010_success_count_recount.sql",
            "LANGUAGE plpgsql VOLATILE AS $$ \
             BEGIN \
                 NEW.success_partition_count := (SELECT count(*) FROM nifi_ops.load_partition p \
                                                  WHERE p.run_id = NEW.run_id AND p.status = 'SUCCESS');",
        )],
    },
    Guard {
        mutant: "MUTANT_NO_START_CAS",
        property: "9",
        code: &[
            (
                "start_validation",
                "if status != RunStatus::ExtractedValidated { return Ok(refused_start(status)); }",
            ),
            ("transition", "WHERE run_id = $1 AND status = $2"),
        ],
    },
    Guard {
        mutant: "MUTANT_NO_PUBLISH_CAS",
        property: "10-one-overwrite",
        code: &[
            (
                "claim_publish",
                "claimed: run.publish_token == Some(token),",
            ),
            (
                "claim_publish",
                "if status != RunStatus::StagingValidated { return Ok(PublishClaim { claimed: false,",
            ),
        ],
    },
    Guard {
        mutant: "MUTANT_NO_PUBLISH_TOKEN_CHECK",
        property: "10-true-outcome",
        code: &[(
            "publish_result",
            "if run.publish_token != Some(token) { return Err(LedgerError::PublishTokenMismatch); }",
        )],
    },
    Guard {
        mutant: "MUTANT_NO_ABORT",
        property: "14",
        code: &[(
            "transition",
            "UPDATE nifi_ops.load_partition SET status = 'ABORTED', completed_at = clock_timestamp(), \
             heartbeat_at = clock_timestamp(), error_code = $2, error_message = 'run ended: ' || $2 \
             WHERE run_id = $1 AND status IN ('PENDING', 'RUNNING', 'RETRY')",
        )],
    },
    Guard {
        mutant: "MUTANT_NO_CONDITIONAL_OUTCOME",
        property: "14-dispatches",
        code: &[
            (
                "record_dispatch_outcome",
                "SET status = 'SENT', sent_at = clock_timestamp(), leased_epoch = NULL, last_http_status = $2, last_error = NULL \
                 WHERE dispatch_id = $1 AND status = 'PENDING'",
            ),
            (
                "record_dispatch_outcome",
                "SET status = 'DEAD', leased_epoch = NULL, last_http_status = $2, last_error = $3 \
                 WHERE dispatch_id = $1 AND status = 'PENDING'",
            ),
        ],
    },
    Guard {
        mutant: "MUTANT_NO_LEASE_FENCE",
        property: "19",
        code: &[
            ("lease_dispatches", "check_fence(conn, fence).await?;"),
            (
                "check_fence",
                "SELECT epoch FROM nifi_ops.leader_epoch WHERE name = $1 FOR SHARE",
            ),
            (
                "check_fence",
                "Some((epoch,)) if epoch == fence.epoch => Ok(()),",
            ),
        ],
    },
    Guard {
        mutant: "MUTANT_NO_OUTCOME_FENCE",
        property: "19",
        code: &[(
            "record_dispatch_outcome",
            "check_fence(conn, fence).await?;",
        )],
    },
    Guard {
        mutant: "MUTANT_NO_SWEEP_FENCE",
        property: "19",
        code: &[("sweep", "check_fence(conn, fence).await?;")],
    },
];

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the ledger crate sits in the workspace")
        .to_path_buf()
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn model() -> String {
    read(&repo().join("spec/model/load_run.pml"))
}

/// The identifier after each `marker` in `text`.
fn words_after<'a>(text: &'a str, marker: &str, allowed: fn(char) -> bool) -> Vec<&'a str> {
    text.match_indices(marker)
        .map(|(at, _)| {
            let rest = &text[at + marker.len()..];
            let end = rest.find(|c: char| !allowed(c)).unwrap_or(rest.len());
            &rest[..end]
        })
        .filter(|w| !w.is_empty())
        .collect()
}

fn op_char(c: char) -> bool {
    c.is_ascii_lowercase() || c == '_' || c == '.'
}

fn event_char(c: char) -> bool {
    c.is_ascii_uppercase() || c == '_'
}

/// One model transition: the tag comment opening an `atomic` block.
#[derive(Debug)]
struct Transition {
    ops: Vec<String>,
    events: Vec<String>,
    environment: bool,
}

fn model_transitions(model: &str) -> Vec<Transition> {
    model
        .match_indices("atomic {")
        .map(|(at, _)| {
            let block = &model[at..];
            let first = block
                .find("/*")
                .filter(|start| !block[..*start].contains("->") && !block[..*start].contains(';'))
                .map(|start| {
                    let end = block[start..].find("*/").expect("comments are closed");
                    &block[start..start + end]
                })
                .unwrap_or("");
            Transition {
                ops: words_after(first, "@op ", op_char)
                    .into_iter()
                    .map(String::from)
                    .collect(),
                events: words_after(first, "@event ", event_char)
                    .into_iter()
                    .map(String::from)
                    .collect(),
                environment: first.contains("@env "),
            }
        })
        .collect()
}

/// The files of `ledger/src/ops`, in name order.
fn ops_files() -> Vec<PathBuf> {
    let mut files: Vec<_> = std::fs::read_dir(repo().join("ledger/src/ops"))
        .expect("ledger/src/ops")
        .map(|e| e.expect("directory entry").path())
        .collect();
    files.sort();
    files
}

/// A source file split at every function definition: (offset, name, text up to the next one).
fn split_functions(text: &str) -> Vec<(usize, String, String)> {
    let starts: Vec<(usize, String)> = text
        .match_indices("fn ")
        .filter(|(at, _)| *at == 0 || text[..*at].ends_with(' '))
        .filter_map(|(at, _)| {
            words_after(&text[at..], "fn ", |c| {
                c.is_ascii_alphanumeric() || c == '_'
            })
            .first()
            .map(|name| (at, name.to_string()))
        })
        .collect();
    starts
        .iter()
        .enumerate()
        .map(|(i, (at, name))| {
            let end = starts
                .get(i + 1)
                .map(|(next, _)| *next)
                .unwrap_or(text.len());
            (*at, name.clone(), text[*at..end].to_string())
        })
        .collect()
}

/// Code with Rust string continuations joined and every run of whitespace made one space (and
/// none after an opening or before a closing brace), so fragments match however lines wrap.
fn normalized(code: &str) -> String {
    let joined = code.replace("\\\n", " ");
    let spaced = joined.split_whitespace().collect::<Vec<_>>().join(" ");
    spaced.replace("{ ", "{").replace(" }", "}")
}

/// A function of `ledger/src/ops`: the events its body writes and the functions it calls.
#[derive(Default)]
struct Function {
    events: BTreeSet<String>,
    calls: BTreeSet<String>,
}

/// A ledger operation: a `pub async fn` of `ledger/src/ops`, or a sweeper rule (`sweep.<rule>`),
/// with the events it writes, its helpers' included.
fn ledger_operations() -> BTreeMap<String, BTreeSet<String>> {
    let files = ops_files();
    let mut functions: BTreeMap<String, Function> = BTreeMap::new();
    let mut bodies = Vec::new();
    let mut operations: BTreeMap<String, String> = BTreeMap::new(); // operation -> function
    for file in files {
        let text = read(&file);
        let rules: Vec<String> = text
            .find("const RULES")
            .map(|at| {
                let list = &text[at..at + text[at..].find("];").expect("RULES ends")];
                words_after(list, "\"", op_char)
                    .into_iter()
                    .map(String::from)
                    .collect()
            })
            .unwrap_or_default();
        for (at, name, body) in split_functions(&text) {
            let entry = functions.entry(name.clone()).or_default();
            entry.events.extend(
                words_after(&body, "Event::new(Level::", |c| c != ')')
                    .into_iter()
                    .filter_map(|args| {
                        words_after(args, "\"", event_char)
                            .first()
                            .map(|s| s.to_string())
                    }),
            );
            bodies.push((name.clone(), body));
            if text[..at].ends_with("pub async ") {
                operations.insert(name.clone(), name.clone());
            } else if let Some(rule) = name
                .strip_prefix("rule_")
                .filter(|r| rules.iter().any(|k| k == r))
            {
                operations.insert(format!("sweep.{rule}"), name.clone());
            }
        }
        for rule in rules {
            assert!(
                operations.contains_key(&format!("sweep.{rule}")),
                "sweeper rule {rule} has no `rule_{rule}` function"
            );
        }
    }
    let names: BTreeSet<String> = functions.keys().cloned().collect();
    for (name, body) in bodies {
        let calls: Vec<String> = names
            .iter()
            .filter(|callee| **callee != name && body.contains(&format!("{callee}(")))
            .cloned()
            .collect();
        functions.get_mut(&name).expect("known").calls.extend(calls);
    }
    operations
        .into_iter()
        .map(|(operation, function)| {
            let mut events = BTreeSet::new();
            let mut seen = BTreeSet::new();
            let mut todo = vec![function];
            while let Some(f) = todo.pop() {
                if !seen.insert(f.clone()) {
                    continue;
                }
                let f = &functions[&f];
                events.extend(f.events.iter().cloned());
                // Another operation called as a helper (e.g. the sweep calling its rules) keeps
                // its own events.
                todo.extend(f.calls.iter().filter(|c| !c.starts_with("rule_")).cloned());
            }
            (operation, events)
        })
        .collect()
}

/// Every event name the ledger can write.
fn ledger_events() -> BTreeSet<String> {
    let mut events = BTreeSet::new();
    let mut dirs = vec![repo().join("ledger/src")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("ledger sources") {
            let path = entry.expect("directory entry").path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let text = read(&path);
                for args in words_after(&text, "Event::new(Level::", |c| c != ')') {
                    if let Some(name) = words_after(args, "\"", event_char).first() {
                        events.insert(name.to_string());
                    }
                }
            }
        }
    }
    events
}

#[test]
fn the_scanners_find_what_the_ledger_has() {
    // Guards the guards: if a refactor changed the shapes the scanners look for, the other tests
    // would pass on empty sets.
    let ops = ledger_operations();
    for op in [
        "report_chunk",
        "claim_partition",
        "cancel_run",
        "sweep.stale_partitions",
    ] {
        assert!(
            ops.contains_key(op),
            "{op} not found among {:?}",
            ops.keys()
        );
    }
    assert!(ops["report_chunk"].contains("PARTITION_SUCCESS"));
    assert!(ops["sweep.stale_partitions"].contains("RECOVERY_REISSUED"));
    let events = ledger_events();
    assert!(events.len() >= 20, "{events:?}");
    let transitions = model_transitions(&model());
    assert!(transitions.len() >= 25, "{} transitions", transitions.len());
}

#[test]
fn every_model_transition_is_a_ledger_operation_or_the_environment() {
    let ops = ledger_operations();
    let events = ledger_events();
    for t in model_transitions(&model()) {
        assert!(
            t.environment || !t.ops.is_empty(),
            "a model transition has neither `@op` nor `@env`: {t:?}"
        );
        for op in &t.ops {
            assert!(
                ops.contains_key(op),
                "the model names `{op}`, which the ledger does not have"
            );
        }
        for event in &t.events {
            assert!(
                events.contains(event),
                "the model writes {event}, which the ledger never does"
            );
        }
    }
}

#[test]
fn every_ledger_operation_is_in_the_model_or_says_why_not() {
    let modelled: BTreeSet<String> = model_transitions(&model())
        .into_iter()
        .flat_map(|t| t.ops)
        .collect();
    let outside: BTreeMap<&str, &str> = OUTSIDE_THE_MODEL.iter().copied().collect();
    for op in ledger_operations().keys() {
        assert!(
            modelled.contains(op) || outside.contains_key(op.as_str()),
            "the ledger operation `{op}` is not in spec/model/load_run.pml: model its transitions \
             (and re-run scripts/model-check), or list it in OUTSIDE_THE_MODEL with the reason"
        );
        assert!(
            !(modelled.contains(op) && outside.contains_key(op.as_str())),
            "`{op}` is both modelled and listed as outside the model"
        );
    }
    for (op, _) in OUTSIDE_THE_MODEL {
        assert!(
            ledger_operations().contains_key(*op),
            "OUTSIDE_THE_MODEL lists `{op}`, which the ledger no longer has"
        );
    }
}

#[test]
fn every_event_an_operation_writes_is_written_by_its_model_transitions() {
    let mut model_events: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for t in model_transitions(&model()) {
        for op in &t.ops {
            model_events
                .entry(op.clone())
                .or_default()
                .extend(t.events.iter().cloned());
        }
    }
    for (op, events) in ledger_operations() {
        let Some(modelled) = model_events.get(&op) else {
            continue;
        };
        for event in events {
            assert!(
                modelled.contains(&event),
                "`{op}` writes {event}, a transition its model transitions lack"
            );
        }
    }
    let all_modelled: BTreeSet<String> = model_events.into_values().flatten().collect();
    let outside: BTreeSet<&str> = EVENTS_OUTSIDE_THE_MODEL.iter().map(|(e, _)| *e).collect();
    for event in ledger_events() {
        assert!(
            all_modelled.contains(&event) || outside.contains(event.as_str()),
            "the ledger writes {event}, which no model transition does"
        );
    }
}

#[test]
fn every_ledger_status_is_a_model_state() {
    let model = model();
    let defined = |name: String| {
        assert!(
            model.contains(&format!("#define {name} ")),
            "status {name} is not a state of the model"
        )
    };
    RunStatus::ALL
        .iter()
        .for_each(|s| defined(s.as_str().to_string()));
    PartitionStatus::ALL
        .iter()
        .for_each(|s| defined(format!("PT_{}", s.as_str())));
    DispatchStatus::ALL
        .iter()
        .for_each(|s| defined(format!("DS_{}", s.as_str())));
}

#[test]
fn every_model_guard_is_the_ledger_code_that_implements_it() {
    // The completion's statement-level model has mutants of its own (its transitions are
    // statements, not ledger operations, so only its guards are mapped).
    let model = model() + &read(&repo().join("spec/model/completion.pml"));
    let script = read(&repo().join("scripts/model-check"));
    let mut bodies: BTreeMap<String, String> = BTreeMap::new();
    for file in ops_files() {
        for (_, name, body) in split_functions(&read(&file)) {
            bodies.entry(name).or_default().push_str(&normalized(&body));
        }
    }
    // A guard implemented in the schema names its migration, `migrations/<file>`.
    for entry in std::fs::read_dir(repo().join("migrations")).expect("migrations") {
        let path = entry.expect("directory entry").path();
        let name = format!("migrations/{}", path.file_name().unwrap().to_string_lossy());
        bodies.insert(name, normalized(&read(&path)));
    }
    let mut mutants: BTreeSet<&str> =
        words_after(&model, "MUTANT_", |c| c.is_ascii_uppercase() || c == '_')
            .into_iter()
            .collect();
    mutants.remove("KEEP_PARTITIONS"); // the helper macro of MUTANT_NO_ABORT
    mutants.remove("START_AGAIN"); // the helper macro of MUTANT_NO_START_CAS
    let listed: BTreeSet<&str> = GUARDS
        .iter()
        .map(|g| g.mutant.trim_start_matches("MUTANT_"))
        .collect();
    assert_eq!(
        mutants, listed,
        "every mutant of the model is a guard of GUARDS, and every guard has its mutant"
    );
    for guard in GUARDS {
        let kebab = guard.mutant.to_lowercase().replace('_', "-");
        let line = format!("check {kebab} {} ", guard.property);
        assert!(
            script.contains(&line),
            "scripts/model-check does not check that {} is caught by property {} (`{line}`)",
            guard.mutant,
            guard.property
        );
        assert!(
            model.contains(&format!("@property {} ", guard.property))
                || model.contains(&format!("@property {} */", guard.property)),
            "the model has no assertion tagged `@property {}`",
            guard.property
        );
        for (function, fragment) in guard.code {
            let body = bodies
                .get(*function)
                .unwrap_or_else(|| panic!("{}: ledger/src/ops has no fn {function}", guard.mutant));
            assert!(
                body.contains(&normalized(fragment)),
                "{}: fn {function} no longer contains `{fragment}`. The model's guard (and its \
                 mutant) stand for that code: change the model with it, re-run scripts/model-check, \
                 then this table",
                guard.mutant
            );
        }
    }
}
