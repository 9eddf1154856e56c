//! Maps the spin model of the run protocol (`spec/model/load_run.pml`) to the ledger that
//! implements it, and fails when the two drift apart: when the ledger gains an operation, an event
//! or a status that the model lacks, when a model transition names nothing in the ledger, or when
//! an operation writes an event its model transitions do not. scripts/model-check runs spin on the
//! model; docs/model.md explains both.
use ledger::{DispatchStatus, PartitionStatus, RunStatus};
use quote::ToTokens;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use syn::visit::{self, Visit};

/// Ledger operations with no transition of the protocol, and why the model does without them.
const OUTSIDE_THE_MODEL: &[(&str, &str)] = &[
    ("list_runs", "read-only"),
    ("run_detail", "read-only"),
    ("run_events", "read-only"),
    ("metrics", "read-only"),
    ("monitor_summary", "read-only"),
    (
        "schema_version",
        "read-only (the schema version, no run state)",
    ),
    (
        "log_schema_at_start",
        "read-only (the schema version logged at start)",
    ),
    (
        "check_schema",
        "read-only (the schema version judged, for readiness)",
    ),
    (
        "alert_counts",
        "read-only (the monitor's alerts counted, for a gauge)",
    ),
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
        "advance_clock",
        "writes the ledger clock only, never a run (ops::continuity: noticing a restore)",
    ),
    (
        "run_went_back",
        "a restore from backup replaces the ledger's past, which no protocol step does; its hold \
         is a fenced CAS through nifi_ops.transition, as a cancel",
    ),
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
    ("RUN_HELD_AFTER_RESTORE", "run_went_back"),
    ("RUN_WENT_BACK", "run_went_back"),
];

/// A guard of the protocol: the model's mutant that removes it, the property that spin must see
/// fire without it (scripts/model-check), and the ledger code that implements it, in named
/// functions of `ledger/src/ops`. The code is read as Rust with `syn`, not as text: comments do
/// not count, and the code must be reachable in the function (not after an unconditional `return`
/// of the same block, not under `if false` or a `#[cfg]`). Changing one of these conditions in the
/// ledger fails `every_model_guard_is_the_ledger_code_that_implements_it` until the model, its
/// mutant and this table say the same again.
struct Guard {
    mutant: &'static str,
    property: &'static str,
    code: &'static [Code],
}

/// A piece of ledger code, in the function named first.
#[derive(Clone, Copy, Debug)]
enum Code {
    /// A statement, compared token by token (layout and comments do not matter).
    Stmt(&'static str, &'static str),
    /// A string literal (the SQL) that contains this text, whitespace-insensitive.
    Sql(&'static str, &'static str),
    /// A migration of `migrations/` (named first) that contains this text, whitespace-insensitive,
    /// its `--` comments removed: the tables and triggers, which live there.
    Migration(&'static str, &'static str),
    /// A server-side function (its file `ledger/functions/<name>.sql`, named first) that contains
    /// this text, whitespace-insensitive, its `--` comments removed.
    Function(&'static str, &'static str),
}

const GUARDS: &[Guard] = &[
    Guard {
        mutant: "MUTANT_NO_TOKEN_CHECK",
        property: "4",
        code: &[
            // The report's claim check, in the one copy of §4.7 steps 2–8, which
            // `nifi_ops.report_chunk_v2` runs before it decides and again when it records.
            Code::Function(
                "record_chunk",
                "IF v_claim_token IS DISTINCT FROM p_claim_token THEN \
                 outcome := 'CLAIM_MISMATCH'; RETURN; END IF;",
            ),
            Code::Function(
                "partition_success",
                "WHERE run_id = p_run_id AND partition_id = p_partition_id AND status = 'RUNNING' \
                 AND claim_token = p_claim_token; won := FOUND; IF NOT won THEN RETURN; END IF;",
            ),
            Code::Function(
                "report_chunk_v2",
                "IF NOT v_won THEN RAISE EXCEPTION 'partition % of run % changed under its row lock', \
                 p_partition_id, p_run_id; END IF;",
            ),
        ],
    },
    Guard {
        mutant: "MUTANT_NO_INVALIDATE",
        property: "4",
        code: &[Code::Sql(
            "rule_stale_partitions",
            "UPDATE nifi_ops.load_file SET status = 'FAILED', updated_at = clock_timestamp() \
             WHERE run_id = $1 AND partition_id = $2 AND status = 'WRITTEN'",
        )],
    },
    Guard {
        mutant: "MUTANT_NO_PIN",
        property: "6-at-least-one",
        code: &[
            Code::Function(
                "partition_success",
                "WHERE run_id = p_run_id AND partition_id > p_partition_id \
                 AND status IN ('PENDING', 'RUNNING', 'RETRY') \
                 ORDER BY partition_id LIMIT 1 FOR KEY SHARE SKIP LOCKED),",
            ),
            Code::Function(
                "partition_success",
                "WHERE run_id = p_run_id AND partition_id < p_partition_id \
                 AND status IN ('PENDING', 'RUNNING', 'RETRY') \
                 AND NOT EXISTS (SELECT 1 FROM after) \
                 ORDER BY partition_id LIMIT 1 FOR KEY SHARE SKIP LOCKED) \
                 SELECT EXISTS (SELECT 1 FROM after) OR EXISTS (SELECT 1 FROM before) INTO pinned;",
            ),
            Code::Function(
                "report_chunk_v2",
                "SELECT s.won, s.pinned INTO v_won, v_pinned FROM nifi_ops.partition_success(",
            ),
            Code::Function("report_chunk_v2", "IF v_pinned THEN RETURN; END IF;"),
            Code::Function(
                "complete_extraction",
                "WHERE r.run_id = p_run_id AND r.status = 'EXTRACTING' \
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
            Code::Function(
                "partition_success",
                "ORDER BY partition_id LIMIT 1 FOR KEY SHARE SKIP LOCKED",
            ),
            Code::Sql("lock_partition", "FOR UPDATE"),
            Code::Function(
                "record_chunk",
                "FROM nifi_ops.load_partition p \
                 WHERE p.run_id = p_run_id AND p.partition_id = p_partition_id FOR UPDATE;",
            ),
            Code::Function(
                "claim_partition_v2",
                "FROM nifi_ops.load_partition p \
                 WHERE p.run_id = p_run_id AND p.partition_id = p_partition_id FOR UPDATE;",
            ),
        ],
    },
    // ... and the recount in a statement of its own, after the wait for the run row.
    Guard {
        mutant: "MUTANT_STALE_RECOUNT",
        property: "completion-at-least-once",
        code: &[
            Code::Function(
                "report_chunk_v2",
                "PERFORM 1 FROM nifi_ops.load_run r \
                 WHERE r.run_id = p_run_id AND r.status = 'EXTRACTING' FOR NO KEY UPDATE; \
                 IF NOT FOUND THEN",
            ),
            Code::Function(
                "report_chunk_v2",
                "IF nifi_ops.complete_extraction(p_run_id, p_dispatch_id, p_extracted_event_id) THEN",
            ),
        ],
    },
    // ... and, with release 0.1.0's successes beside this release's (a rolling upgrade, a
    // rollback), the trigger that makes 0.1.0's increment of `success_partition_count` return
    // the count of SUCCESS partitions ...
    Guard {
        mutant: "MUTANT_NO_TRIGGER",
        property: "completion-at-least-once",
        code: &[Code::Migration(
            "20261205000017_contract_values.sql",
            "BEFORE UPDATE OF success_partition_count, status ON nifi_ops.load_run \
             FOR EACH ROW \
             WHEN ((NEW.success_partition_count IS DISTINCT FROM OLD.success_partition_count \
                    AND NEW.status = 'EXTRACTING') \
                   OR (OLD.status = 'EXTRACTING' AND NEW.status IS DISTINCT FROM 'EXTRACTING')) \
             EXECUTE FUNCTION nifi_ops.load_run_success_recount();",
        )],
    },
    // ... counting from a snapshot of its own, taken after the update won the run row.
    Guard {
        mutant: "MUTANT_TRIGGER_STABLE",
        property: "completion-at-least-once",
        code: &[
            Code::Function(
                "load_run_success_recount",
                "LANGUAGE plpgsql VOLATILE AS $$ \
                 BEGIN \
                     NEW.success_partition_count := nifi_ops.run_success_count(NEW.run_id);",
            ),
            Code::Function(
                "run_success_count",
                "RETURNS integer LANGUAGE plpgsql VOLATILE AS $$ \
                 BEGIN \
                     RETURN (SELECT count(*) FROM nifi_ops.load_partition p \
                              WHERE p.run_id = p_run_id AND p.status = 'SUCCESS');",
            ),
        ],
    },
    Guard {
        mutant: "MUTANT_NO_START_CAS",
        property: "9-stage",
        code: &[
            Code::Function(
                "start_validation_v2",
                "IF run_status = 'EXTRACTED_VALIDATED' THEN SELECT t.changed INTO v_won \
                 FROM nifi_ops.transition(p_run_id, 'EXTRACTED_VALIDATED', 'STAGE_VALIDATING',",
            ),
            Code::Function(
                "start_validation_v2",
                "ELSIF NOT EXISTS (SELECT 1 FROM nifi_ops.load_event e \
                 WHERE e.event_id = p_event_id AND e.run_id = p_run_id \
                 AND e.event_name = 'STAGE_VALIDATION_STARTED') THEN outcome := 'REFUSED'; RETURN; END IF;",
            ),
            Code::Function(
                "transition",
                "WHERE run_id = p_run_id AND status = p_from; changed := FOUND;",
            ),
        ],
    },
    Guard {
        mutant: "MUTANT_NO_PUBLISH_CAS",
        property: "10-one-overwrite",
        code: &[
            Code::Stmt(
                "claim_publish",
                "if status == RunStatus::Publishing { return Ok(PublishClaim { \
                 claimed: run.publish_token == Some(token), run_status: status, }); }",
            ),
            Code::Stmt(
                "claim_publish",
                "if status != RunStatus::StagingValidated { return Ok(PublishClaim { \
                 claimed: false, run_status: status, }); }",
            ),
        ],
    },
    Guard {
        mutant: "MUTANT_NO_PUBLISH_TOKEN_CHECK",
        property: "10-true-outcome",
        code: &[Code::Stmt(
            "publish_result",
            "if run.publish_token != Some(token) { return Err(LedgerError::PublishTokenMismatch); }",
        )],
    },
    Guard {
        mutant: "MUTANT_NO_ABORT",
        property: "13-partitions",
        code: &[Code::Function(
            "transition",
            "IF v_step.aborts_partitions THEN UPDATE nifi_ops.load_partition SET status = 'ABORTED', \
                 completed_at = clock_timestamp(), heartbeat_at = clock_timestamp(), error_code = p_to, \
                 error_message = 'run ended: ' || p_to \
                 WHERE run_id = p_run_id AND status IN ('PENDING', 'RUNNING', 'RETRY');",
        )],
    },
    Guard {
        mutant: "MUTANT_NO_CONDITIONAL_OUTCOME",
        property: "14-dispatches",
        code: &[
            Code::Sql(
                "record_dispatch_outcome",
                "SET status = 'SENT', sent_at = clock_timestamp(), leased_epoch = NULL, last_http_status = $2, last_error = NULL \
                 WHERE dispatch_id = $1 AND status = 'PENDING'",
            ),
            Code::Sql(
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
            Code::Stmt("lease_dispatches", "check_fence(conn, fence).await?;"),
            Code::Sql(
                "check_fence",
                "SELECT epoch FROM nifi_ops.leader_epoch WHERE name = $1 FOR SHARE",
            ),
            Code::Stmt(
                "check_fence",
                "match current { Some((epoch,)) if epoch == fence.epoch => Ok(()), \
                 other => Err(LedgerError::Fenced { ours: fence.epoch, current: other.map(|c| c.0), }), }",
            ),
        ],
    },
    Guard {
        mutant: "MUTANT_NO_OUTCOME_FENCE",
        property: "19",
        code: &[Code::Stmt(
            "record_dispatch_outcome",
            "check_fence(conn, fence).await?;",
        )],
    },
    Guard {
        // A cancel once publishing has begun: the state machine's table has no such row, so the
        // database refuses it whatever the Rust check says.
        mutant: "MUTANT_CANCEL_PUBLISHING",
        property: "transitions",
        code: &[
            Code::Stmt(
                "cancellable",
                "crate::machine::allowed(s, RunStatus::Cancelled)",
            ),
            Code::Migration(
                "20261205000019_run_transition_table.sql",
                "('STAGING_VALIDATED', 'CANCELLED', true, true, 'run cancelled'), ('CREATED', 'PUBLISH_UNKNOWN'",
            ),
        ],
    },
    Guard {
        mutant: "MUTANT_NO_SWEEP_FENCE",
        property: "19",
        code: &[Code::Stmt(
            "sweep_transaction",
            "check_fence(conn, fence).await?;",
        )],
    },
];

/// What a function's body holds, read by `syn`: its statements, the conditions of its `if`s and
/// its string literals, each with whether it is reachable. Comments are not tokens, so they are not
/// there at all. The bodies of macros that parse as expressions (`transaction!(self, |conn| async
/// { … })`, `format!`) are read too.
#[derive(Default, Debug)]
struct Body {
    stmts: Vec<(String, bool)>,
    strings: Vec<(String, bool)>,
}

impl Body {
    fn holds(&self, code: &Code) -> Result<(), String> {
        let (kind, found): (&str, Vec<bool>) = match code {
            Code::Stmt(_, s) => {
                let want = stmt_tokens(s);
                (
                    "statement",
                    self.stmts
                        .iter()
                        .filter(|(t, _)| *t == want)
                        .map(|(_, r)| *r)
                        .collect(),
                )
            }
            Code::Migration(..) | Code::Function(..) => {
                return Err("a migration or a server-side function is not Rust".to_string());
            }
            Code::Sql(_, q) => {
                let want = normalized(q);
                (
                    "string",
                    self.strings
                        .iter()
                        .filter(|(t, _)| t.contains(&want))
                        .map(|(_, r)| *r)
                        .collect(),
                )
            }
        };
        if found.iter().any(|r| *r) {
            Ok(())
        } else if found.is_empty() {
            Err(format!("no such {kind}"))
        } else {
            Err(format!(
                "the {kind} is there but never runs (after an unconditional exit, under `if false` \
                 or a #[cfg])"
            ))
        }
    }
}

/// A statement's tokens as text: one canonical spelling, whatever the layout and the comments.
fn stmt_tokens(code: &str) -> String {
    let stmts = syn::parse::Parser::parse_str(syn::Block::parse_within, code)
        .unwrap_or_else(|e| panic!("GUARDS: `{code}` is not Rust statements: {e}"));
    assert_eq!(stmts.len(), 1, "GUARDS: `{code}` is not one statement");
    canonical(&stmts[0])
}

/// Tokens as text, without the trailing commas that rustfmt adds when a list wraps.
fn canonical(tokens: &impl ToTokens) -> String {
    let trailing = regex::Regex::new(r"\s*,\s*([)\]}])").expect("regex");
    trailing
        .replace_all(&tokens.to_token_stream().to_string(), "$1")
        .into_owned()
}

/// Whether a statement always leaves its block: `return`, `break`, `continue`, a panic, or a
/// block or an `if`/`else` all of whose ways do. (`?` may or may not return: it does not count.)
fn diverges(stmt: &syn::Stmt) -> bool {
    match stmt {
        syn::Stmt::Expr(e, _) => expr_diverges(e),
        syn::Stmt::Macro(m) => panics(&m.mac),
        _ => false,
    }
}

fn expr_diverges(e: &syn::Expr) -> bool {
    match e {
        syn::Expr::Return(_) | syn::Expr::Break(_) | syn::Expr::Continue(_) => true,
        syn::Expr::Macro(m) => panics(&m.mac),
        syn::Expr::Paren(p) => expr_diverges(&p.expr),
        syn::Expr::Block(b) => b.label.is_none() && b.block.stmts.iter().any(diverges),
        syn::Expr::If(i) => {
            i.then_branch.stmts.iter().any(diverges)
                && i.else_branch
                    .as_ref()
                    .is_some_and(|(_, e)| expr_diverges(e))
        }
        _ => false,
    }
}

fn panics(mac: &syn::Macro) -> bool {
    mac.path.segments.last().is_some_and(|s| {
        ["panic", "unreachable", "todo", "unimplemented"].contains(&s.ident.to_string().as_str())
    })
}

fn constant(e: &syn::Expr) -> Option<bool> {
    match e {
        syn::Expr::Lit(syn::ExprLit {
            lit: syn::Lit::Bool(b),
            ..
        }) => Some(b.value),
        syn::Expr::Paren(p) => constant(&p.expr),
        _ => None,
    }
}

/// Walks a function's body, knowing at each point whether the code there can run.
struct Reader {
    reachable: bool,
    body: Body,
}

impl Reader {
    fn under(&mut self, reachable: bool, f: impl FnOnce(&mut Self)) {
        let saved = self.reachable;
        self.reachable = saved && reachable;
        f(self);
        self.reachable = saved;
    }
}

impl<'ast> Visit<'ast> for Reader {
    fn visit_block(&mut self, block: &'ast syn::Block) {
        let saved = self.reachable;
        for stmt in &block.stmts {
            self.visit_stmt(stmt);
            if diverges(stmt) {
                self.reachable = false;
            }
        }
        self.reachable = saved;
    }

    fn visit_stmt(&mut self, stmt: &'ast syn::Stmt) {
        let attrs: &[syn::Attribute] = match stmt {
            syn::Stmt::Local(l) => &l.attrs,
            syn::Stmt::Macro(m) => &m.attrs,
            syn::Stmt::Item(_) => &[],
            syn::Stmt::Expr(e, _) => match e {
                syn::Expr::Call(c) => &c.attrs,
                syn::Expr::MethodCall(c) => &c.attrs,
                syn::Expr::Await(a) => &a.attrs,
                syn::Expr::Try(t) => &t.attrs,
                syn::Expr::If(i) => &i.attrs,
                syn::Expr::Block(b) => &b.attrs,
                _ => &[],
            },
        };
        let configured = attrs.iter().any(|a| a.path().is_ident("cfg"));
        self.under(!configured, |r| {
            r.body.stmts.push((canonical(stmt), r.reachable));
            visit::visit_stmt(r, stmt);
        });
    }

    fn visit_expr_if(&mut self, e: &'ast syn::ExprIf) {
        self.visit_expr(&e.cond);
        let known = constant(&e.cond);
        self.under(known != Some(false), |r| r.visit_block(&e.then_branch));
        if let Some((_, other)) = &e.else_branch {
            self.under(known != Some(true), |r| r.visit_expr(other));
        }
    }

    fn visit_expr_while(&mut self, e: &'ast syn::ExprWhile) {
        self.visit_expr(&e.cond);
        let runs = constant(&e.cond) != Some(false);
        self.under(runs, |r| r.visit_block(&e.body));
    }

    fn visit_lit_str(&mut self, s: &'ast syn::LitStr) {
        self.body
            .strings
            .push((normalized(&s.value()), self.reachable));
    }

    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        let args = mac.parse_body_with(
            syn::punctuated::Punctuated::<syn::Expr, syn::Token![,]>::parse_terminated,
        );
        if let Ok(args) = args {
            for arg in &args {
                self.visit_expr(arg);
            }
        }
    }
}

/// The functions (free, in `impl`s, nested) named `name` in a Rust source file, read.
fn function_bodies(source: &str, name: &str) -> Vec<Body> {
    struct Finder<'n> {
        name: &'n str,
        found: Vec<Body>,
    }
    impl<'ast> Visit<'ast> for Finder<'_> {
        fn visit_item_fn(&mut self, f: &'ast syn::ItemFn) {
            if f.sig.ident == self.name {
                self.found.push(read_body(&f.block));
            }
            visit::visit_item_fn(self, f);
        }
        fn visit_impl_item_fn(&mut self, f: &'ast syn::ImplItemFn) {
            if f.sig.ident == self.name {
                self.found.push(read_body(&f.block));
            }
            visit::visit_impl_item_fn(self, f);
        }
    }
    let file = syn::parse_file(source).unwrap_or_else(|e| panic!("not Rust: {e}"));
    let mut finder = Finder {
        name,
        found: Vec::new(),
    };
    finder.visit_file(&file);
    finder.found
}

fn read_body(block: &syn::Block) -> Body {
    let mut reader = Reader {
        reachable: true,
        body: Body::default(),
    };
    reader.visit_block(block);
    reader.body
}

/// Whether `code` is reachable code of the function it names in `source`.
fn source_holds(source: &str, code: &Code) -> Result<(), String> {
    let (Code::Stmt(function, _)
    | Code::Sql(function, _)
    | Code::Migration(function, _)
    | Code::Function(function, _)) = code;
    let bodies = function_bodies(source, function);
    if bodies.is_empty() {
        return Err(format!("no fn {function}"));
    }
    let mut why = String::new();
    for body in &bodies {
        match body.holds(code) {
            Ok(()) => return Ok(()),
            Err(e) => why = e,
        }
    }
    Err(why)
}

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
/// Every `.rs` file under `ledger/src/ops`, its subdirectories (the sweeper's rules) included.
fn ops_files() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).expect("ledger/src/ops") {
            let p = e.expect("directory entry").path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    let mut files = Vec::new();
    walk(&repo().join("ledger/src/ops"), &mut files);
    files.sort();
    files
}

/// Whitespace made one space (and none after an opening or before a closing brace), so SQL
/// fragments match however the lines wrap.
fn normalized(code: &str) -> String {
    let spaced = code.split_whitespace().collect::<Vec<_>>().join(" ");
    spaced.replace("{ ", "{").replace(" }", "}")
}

/// What a piece of ledger code does, read by `syn` (comments are not there): the events it writes
/// (`Event::new(Level::…, "NAME")`) and the names it calls. Nested functions are scanned on their
/// own; macro bodies that parse as expressions (`transaction!`, `vec!`) are read.
#[derive(Default)]
struct Function {
    events: BTreeSet<String>,
    calls: BTreeSet<String>,
}

impl<'ast> Visit<'ast> for Function {
    fn visit_expr_call(&mut self, call: &'ast syn::ExprCall) {
        if let syn::Expr::Path(p) = &*call.func {
            let path: Vec<String> = p
                .path
                .segments
                .iter()
                .map(|s| s.ident.to_string())
                .collect();
            if path.ends_with(&["Event".to_string(), "new".to_string()]) {
                let level = call.args.first().is_some_and(|a| {
                    matches!(a, syn::Expr::Path(l)
                        if l.path.segments.first().is_some_and(|s| s.ident == "Level"))
                });
                if let (
                    true,
                    Some(syn::Expr::Lit(syn::ExprLit {
                        lit: syn::Lit::Str(name),
                        ..
                    })),
                ) = (level, call.args.iter().nth(1))
                {
                    let name = name.value();
                    if !name.is_empty() && name.chars().all(event_char) {
                        self.events.insert(name);
                    }
                }
            }
            if let Some(last) = path.last() {
                self.calls.insert(last.clone());
            }
        }
        visit::visit_expr_call(self, call);
    }

    fn visit_expr_method_call(&mut self, call: &'ast syn::ExprMethodCall) {
        self.calls.insert(call.method.to_string());
        visit::visit_expr_method_call(self, call);
    }

    // A `const` statement named by the code (`sqlx::query_as(CLAIM_PARTITION)`).
    fn visit_expr_path(&mut self, p: &'ast syn::ExprPath) {
        if let Some(name) = p.path.get_ident().map(ToString::to_string)
            && name
                .chars()
                .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
        {
            self.calls.insert(name);
        }
        visit::visit_expr_path(self, p);
    }

    // A server-side function called by the SQL (`nifi_ops.claim_partition(…)`).
    fn visit_lit_str(&mut self, s: &'ast syn::LitStr) {
        self.calls.extend(sql_calls(&s.value()));
    }

    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        if let Ok(args) = mac.parse_body_with(
            syn::punctuated::Punctuated::<syn::Expr, syn::Token![,]>::parse_terminated,
        ) {
            for arg in &args {
                self.visit_expr(arg);
            }
        }
    }

    // A nested function is a function of its own.
    fn visit_item_fn(&mut self, _: &'ast syn::ItemFn) {}
}

/// Every function of a source file (free, in `impl`s, nested): its name, whether it is a
/// `pub async fn`, and what its body does.
fn file_functions(source: &str) -> Vec<(String, bool, Function)> {
    #[derive(Default)]
    struct Collector {
        found: Vec<(String, bool, Function)>,
    }
    impl Collector {
        fn add(&mut self, vis: &syn::Visibility, sig: &syn::Signature, block: &syn::Block) {
            let mut f = Function::default();
            f.visit_block(block);
            let operation = matches!(vis, syn::Visibility::Public(_)) && sig.asyncness.is_some();
            self.found.push((sig.ident.to_string(), operation, f));
        }
    }
    impl<'ast> Visit<'ast> for Collector {
        fn visit_item_fn(&mut self, f: &'ast syn::ItemFn) {
            self.add(&f.vis, &f.sig, &f.block);
            visit::visit_item_fn(self, f);
        }
        fn visit_impl_item_fn(&mut self, f: &'ast syn::ImplItemFn) {
            self.add(&f.vis, &f.sig, &f.block);
            visit::visit_impl_item_fn(self, f);
        }
    }
    let file = syn::parse_file(source).unwrap_or_else(|e| panic!("not Rust: {e}"));
    let mut collector = Collector::default();
    collector.visit_file(&file);
    // A `const` holding a statement is scanned like a function: what its SQL calls.
    for item in &file.items {
        if let syn::Item::Const(c) = item {
            let mut f = Function::default();
            f.visit_expr(&c.expr);
            collector.found.push((c.ident.to_string(), false, f));
        }
    }
    collector.found
}

/// The server-side functions of `nifi_ops` that a piece of SQL calls, as `nifi_ops.<name>`.
fn sql_calls(sql: &str) -> Vec<String> {
    sql.match_indices("nifi_ops.")
        .filter_map(|(at, marker)| {
            let rest = &sql[at + marker.len()..];
            let end =
                rest.find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'))?;
            rest[end..]
                .starts_with('(')
                .then(|| format!("nifi_ops.{}", &rest[..end]))
        })
        .collect()
}

/// Text split at the commas outside parentheses and quotes.
fn top_level_items(text: &str) -> Vec<String> {
    let (mut items, mut current, mut depth, mut quoted) = (Vec::new(), String::new(), 0i32, false);
    for c in text.chars() {
        match c {
            '\'' => quoted = !quoted,
            '(' if !quoted => depth += 1,
            ')' if !quoted => depth -= 1,
            ',' if !quoted && depth == 0 => {
                items.push(current.trim().to_string());
                current.clear();
                continue;
            }
            _ => {}
        }
        current.push(c);
    }
    items.push(current.trim().to_string());
    items
}

/// The text inside the parentheses that open at the start of `text`.
fn parenthesized(text: &str) -> Option<&str> {
    let text = text.trim_start().strip_prefix('(')?;
    let mut depth = 1;
    for (i, c) in text.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => {
                depth -= 1;
                if depth == 0 {
                    return Some(&text[..i]);
                }
            }
            _ => {}
        }
    }
    None
}

/// The server-side functions of `nifi_ops` as `ledger/functions/` defines them (what `migrate`
/// applies after the migrations), with the events they write: the literal event name of each
/// `nifi_ops.record_event(…)` call in the function's body. An event name that is not a literal
/// fails here (the mapping could not see it), and so does an event row inserted by hand.
fn sql_functions() -> BTreeMap<String, BTreeSet<String>> {
    sql_function_bodies()
        .into_iter()
        .map(|(name, f)| (name, f.events))
        .collect()
}

/// `sql_functions`, with the server-side functions each one calls (`nifi_ops.report_chunk_v2`
/// runs `nifi_ops.partition_success`, whose events it writes).
fn sql_function_bodies() -> BTreeMap<String, Function> {
    let mut files: Vec<_> = std::fs::read_dir(repo().join("ledger/functions"))
        .expect("ledger/functions")
        .map(|e| e.expect("directory entry").path())
        .collect();
    files.sort();
    let mut functions = BTreeMap::new();
    for file in files {
        let sql: String = read(&file)
            .lines()
            .map(|l| l.split("--").next().unwrap_or(""))
            .collect::<Vec<_>>()
            .join("\n");
        for (at, marker) in sql.match_indices("CREATE OR REPLACE FUNCTION nifi_ops.") {
            let rest = &sql[at + marker.len()..];
            let name = &rest[..rest.find('(').expect("a function has parameters")];
            let body = rest.split("$$").nth(1).expect("a function body in $$ … $$");
            // Every event row goes through nifi_ops.record_event (its conventions in one place):
            // a row inserted by hand anywhere else fails here.
            assert!(
                name == "record_event" || !body.contains("INSERT INTO nifi_ops.load_event"),
                "nifi_ops.{name} inserts an event row by hand: call nifi_ops.record_event"
            );
            let mut events = BTreeSet::new();
            for (i, call) in body.match_indices("nifi_ops.record_event(") {
                let args =
                    parenthesized(&body[i + call.len() - 1..]).expect("record_event's arguments");
                let args = top_level_items(args);
                // (event id, level, name, …)
                let value = args
                    .get(2)
                    .unwrap_or_else(|| panic!("nifi_ops.{name}: an event without its name"));
                let event = value.trim_matches('\'');
                assert!(
                    !event.is_empty() && event.chars().all(event_char) && value.starts_with('\''),
                    "nifi_ops.{name}: the event name `{value}` is not a literal"
                );
                events.insert(event.to_string());
            }
            let calls = sql_calls(body).into_iter().collect();
            functions.insert(format!("nifi_ops.{name}"), Function { events, calls });
        }
    }
    functions
}

/// The strings of a source file's `const RULES` (the sweeper's rules, in order).
fn sweeper_rules(source: &str) -> Vec<String> {
    let file = syn::parse_file(source).unwrap_or_else(|e| panic!("not Rust: {e}"));
    let mut rules = Vec::new();
    for item in &file.items {
        if let syn::Item::Const(c) = item
            && c.ident == "RULES"
            && let syn::Expr::Array(list) = &*c.expr
        {
            for e in &list.elems {
                if let syn::Expr::Lit(syn::ExprLit {
                    lit: syn::Lit::Str(s),
                    ..
                }) = e
                {
                    rules.push(s.value());
                }
            }
        }
    }
    rules
}

/// A ledger operation: a `pub async fn` of `ledger/src/ops`, or a sweeper rule (`sweep.<rule>`),
/// with the events it writes, its helpers' included.
fn ledger_operations() -> BTreeMap<String, BTreeSet<String>> {
    let mut functions: BTreeMap<String, Function> = BTreeMap::new();
    functions.extend(sql_function_bodies());
    let mut operations: BTreeMap<String, String> = BTreeMap::new(); // operation -> function
    // The rules are listed in one file and decided in others (ledger/src/ops/sweeper/).
    let texts: Vec<String> = ops_files().iter().map(|f| read(f)).collect();
    let rules: Vec<String> = texts.iter().flat_map(|t| sweeper_rules(t)).collect();
    for text in &texts {
        for (name, operation, f) in file_functions(text) {
            let entry = functions.entry(name.clone()).or_default();
            entry.events.extend(f.events);
            entry.calls.extend(f.calls);
            if operation {
                operations.insert(name.clone(), name.clone());
            } else if let Some(rule) = name
                .strip_prefix("rule_")
                .filter(|r| rules.iter().any(|k| k == r))
            {
                operations.insert(format!("sweep.{rule}"), name.clone());
            }
        }
    }
    assert!(!rules.is_empty(), "no `const RULES` under ledger/src/ops");
    for rule in &rules {
        assert!(
            operations.contains_key(&format!("sweep.{rule}")),
            "sweeper rule {rule} has no `rule_{rule}` function"
        );
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
                todo.extend(
                    f.calls
                        .iter()
                        .filter(|c| !c.starts_with("rule_") && functions.contains_key(*c))
                        .cloned(),
                );
            }
            (operation, events)
        })
        .collect()
}

/// Every event name the ledger can write (its own server-side functions' included).
fn ledger_events() -> BTreeSet<String> {
    let mut events: BTreeSet<String> = sql_functions().into_values().flatten().collect();
    let mut dirs = vec![repo().join("ledger/src")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("ledger sources") {
            let path = entry.expect("directory entry").path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                for (_, _, f) in file_functions(&read(&path)) {
                    events.extend(f.events);
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
    assert!(sql_functions()["nifi_ops.partition_success"].contains("PARTITION_SUCCESS"));
    // Written by the server-side function the operation calls (through the const holding its
    // statement).
    assert!(
        ops["claim_partition"].contains("PARTITION_STARTED"),
        "{:?}",
        ops["claim_partition"]
    );
    assert!(sql_functions().contains_key("nifi_ops.record_chunk"));
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
    let sources: Vec<String> = ops_files().iter().map(|f| read(f)).collect();
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
        for code in guard.code {
            let sql_file = match code {
                Code::Migration(file, _) => Some(format!("migrations/{file}")),
                Code::Function(name, _) => Some(format!("ledger/functions/{name}.sql")),
                _ => None,
            };
            if let (Some(file), Code::Migration(_, text) | Code::Function(_, text)) =
                (sql_file, code)
            {
                let sql: String = read(&repo().join(&file))
                    .lines()
                    .map(|l| l.split("--").next().unwrap_or(""))
                    .collect::<Vec<_>>()
                    .join("\n");
                assert!(
                    normalized(&sql).contains(&normalized(text)),
                    "{}: {file} no longer contains `{text}`. The model's guard (and \
                     its mutant) stand for that code: change the model with it, re-run \
                     scripts/model-check, then this table",
                    guard.mutant
                );
                continue;
            }
            let results: Vec<Result<(), String>> =
                sources.iter().map(|s| source_holds(s, code)).collect();
            if results.iter().any(Result::is_ok) {
                continue;
            }
            let why = results
                .into_iter()
                .filter_map(Result::err)
                .find(|e| !e.starts_with("no fn "))
                .unwrap_or_else(|| "ledger/src/ops has no such function".to_string());
            panic!(
                "{}: {code:?}: {why}. The model's guard (and its mutant) stand for that code: \
                 change the model with it, re-run scripts/model-check, then this table",
                guard.mutant
            );
        }
    }
}

/// The guard reader on small sources: what the ledger's text would still match, it refuses.
#[test]
fn a_guard_that_is_commented_out_or_never_runs_is_not_the_guard() {
    let fence = Code::Stmt("sweep", "check_fence(conn, fence).await?;");
    let sql = Code::Sql("sweep", "WHERE dispatch_id = $1 AND status = 'PENDING'");
    let source = |body: &str| {
        format!(
            "impl Ledger {{ pub async fn sweep(&self, fence: &Fence) -> LedgerResult<()> {{ \
             transaction!(self, |conn| async {{ {body} }}) }} }}"
        )
    };
    let holds = |body: &str, code: &Code| source_holds(&source(body), code);

    // The guard as the ledger writes it, however the lines wrap, passes.
    let live = "check_fence(conn, fence).await?; \
                sqlx::query(\"UPDATE d SET status = 'SENT' \\\n      WHERE dispatch_id = $1 AND status = 'PENDING'\"); \
                Ok(())";
    assert_eq!(holds(live, &fence), Ok(()));
    assert_eq!(holds(live, &sql), Ok(()));
    assert_eq!(
        holds(
            "check_fence(\n  conn,\n  fence, // ours\n).await?; Ok(())",
            &fence
        ),
        Ok(())
    );

    // Commented out: a line comment, a block comment, a doc comment's text.
    for body in [
        "// check_fence(conn, fence).await?;\n Ok(())",
        "/* check_fence(conn, fence).await?; */ Ok(())",
        "/// check_fence(conn, fence).await?;\n let x = 1; Ok(())",
    ] {
        assert_eq!(
            holds(body, &fence),
            Err("no such statement".to_string()),
            "{body}"
        );
    }
    assert_eq!(
        holds(
            "// sqlx::query(\"UPDATE d SET status = 'SENT' WHERE dispatch_id = $1 AND status = 'PENDING'\");\n Ok(())",
            &sql
        ),
        Err("no such string".to_string())
    );
    // Only a string that spells it.
    assert_eq!(
        holds(
            "let s = \"check_fence(conn, fence).await?;\"; Ok(())",
            &fence
        ),
        Err("no such statement".to_string())
    );

    // There, but never run: after an early return of the same block (or of an enclosing one),
    // after an `if` whose every way returns, under `if false`, under a #[cfg]. (A #[cfg] on the
    // statement itself makes it another statement: not found at all.)
    for body in [
        "return Ok(()); check_fence(conn, fence).await?; Ok(())",
        "if tired { return Ok(()); } else { return Err(e); } check_fence(conn, fence).await?; Ok(())",
        "{ return Ok(()); } check_fence(conn, fence).await?; Ok(())",
        "if false { check_fence(conn, fence).await?; } Ok(())",
        "if true { } else { check_fence(conn, fence).await?; } Ok(())",
        "panic!(\"later\"); check_fence(conn, fence).await?; Ok(())",
        "#[cfg(any())] { check_fence(conn, fence).await?; } Ok(())",
    ] {
        let got = holds(body, &fence);
        assert!(
            got.as_ref().is_err_and(|e| e.contains("never runs")),
            "{body}: {got:?}"
        );
    }
    assert!(
        holds(
            "#[cfg(any())] check_fence(conn, fence).await?; Ok(())",
            &fence
        )
        .is_err()
    );
    assert!(holds(
        "return Ok(()); sqlx::query(\"UPDATE d SET status = 'SENT' WHERE dispatch_id = $1 AND status = 'PENDING'\"); Ok(())",
        &sql
    )
    .is_err_and(|e| e.contains("never runs")));

    // A conditional exit before it does not make it unreachable, nor does `?`.
    assert_eq!(
        holds(
            "if !got { return Ok(None); } x.await?; check_fence(conn, fence).await?; Ok(())",
            &fence
        ),
        Ok(())
    );
    // A changed guard is not the guard.
    assert_eq!(
        holds("check_fence(conn, other).await?; Ok(())", &fence),
        Err("no such statement".to_string())
    );
    assert_eq!(
        holds("let _ = check_fence(conn, fence).await; Ok(())", &fence),
        Err("no such statement".to_string())
    );
}

/// The operation and event scanners read code too: an event or a call in a comment is not one.
#[test]
fn the_scanners_read_code_not_comments() {
    let source = r#"
        impl Ledger {
            /// Writes `Event::new(Level::Info, "IN_A_DOC")` … no: it does not.
            pub async fn op(&self) -> LedgerResult<()> {
                // Event::new(Level::Info, "IN_A_COMMENT"); helper_in_a_comment(conn);
                /* Event::new(Level::Info, "IN_A_BLOCK") */
                transaction!(self, |conn| async {
                    helper(conn).await?;
                    insert_event(conn, Event::new(Level::Info, "LIVE")).await
                })
            }
        }
        async fn helper(conn: &mut PgConnection) {}
        async fn helper_in_a_comment(conn: &mut PgConnection) {}
    "#;
    let functions = file_functions(source);
    let (_, operation, op) = functions
        .iter()
        .find(|(name, _, _)| name == "op")
        .expect("op");
    assert!(*operation);
    assert_eq!(op.events, BTreeSet::from(["LIVE".to_string()]));
    assert!(op.calls.contains("helper"));
    assert!(!op.calls.contains("helper_in_a_comment"));
    let (_, operation, _) = functions
        .iter()
        .find(|(name, _, _)| name == "helper")
        .expect("helper");
    assert!(!*operation, "a private fn is not an operation");
}
