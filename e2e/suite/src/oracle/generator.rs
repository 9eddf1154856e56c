//! Seeded request sequences. The generator reads the model (statuses, tokens, dispatch ids) to
//! make requests that matter in the state the runs are in: mostly the NiFi hot path, with
//! replays (identical and changed), contending workers and publishers, stale tokens, failures,
//! cancels, resolutions, resends and cleanups mixed in. Only the seed and the model's
//! structure decide what is drawn, so a seed replays the same sequence.
use super::bodies::{self, opt, uuid};
use super::model::{Model, RowExt, is_terminal};
use super::request::{ChunkReq, Enc, ManifestReq, Op, Opt, Request, Target};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::json;
use std::collections::BTreeMap;
use uuid::Uuid;

/// One PG-20 worker's claim of a partition and the chunks it will report.
#[derive(Clone, Debug)]
pub(super) struct Work {
    pub(super) token: Uuid,
    pub(super) worker: String,
    pub(super) plan: Vec<ChunkReq>,
    pub(super) sent: Vec<usize>,
}

pub struct Generator {
    pub(super) rng: StdRng,
    pub(super) job: String,
    pub(super) keys: Vec<String>,
    pub(super) work: BTreeMap<(usize, String), Work>,
    pub(super) manifests: BTreeMap<usize, ManifestReq>,
    pub(super) publish: BTreeMap<usize, Uuid>,
}

pub(super) type Choice = (u32, Op);

impl Generator {
    pub fn new(seed: u64, sequence: u64, job: &str) -> Generator {
        let mix = seed ^ sequence.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        Generator {
            rng: StdRng::seed_from_u64(mix),
            job: job.into(),
            keys: Vec::new(),
            work: BTreeMap::new(),
            manifests: BTreeMap::new(),
            publish: BTreeMap::new(),
        }
    }

    pub fn length(&mut self) -> usize {
        self.rng.random_range(20..90)
    }

    pub fn next(&mut self, model: &Model) -> Request {
        let mut choices: Vec<Choice> = Vec::new();
        self.global(model, &mut choices);
        let from = model.runs.len().saturating_sub(3);
        for i in from..model.runs.len() {
            self.for_run(model, i, &mut choices);
        }
        let total: u32 = choices.iter().map(|c| c.0).sum();
        let mut pick = self.rng.random_range(0..total);
        let mut op = None;
        for (w, o) in choices {
            if pick < w {
                op = Some(o);
                break;
            }
            pick -= w;
        }
        let r = &mut self.rng;
        let enc = Enc {
            strings: r.random_bool(0.4),
            snake: r.random_bool(0.15),
            uuid_form: [0, 0, 0, 0, 0, 0, 0, 1, 2, 2][r.random_range(0..10)],
        };
        let op = op.expect("a choice");
        self.note(&op);
        Request { op, enc }
    }

    /// Remembers which of a worker's planned chunks went out (a replay draws from these).
    fn note(&mut self, op: &Op) {
        if let Op::Chunk(Target::Run(i), pid, c) = op
            && let Some(w) = self.work.get_mut(&(*i, pid.clone()))
            && let Some(k) = w.plan.iter().position(|p| {
                p.token == c.token
                    && p.index == c.index
                    && p.path == c.path
                    && p.records == c.records
            })
            && !w.sent.contains(&k)
        {
            w.sent.push(k);
        }
    }

    pub(super) fn text(&mut self, short: &str) -> String {
        match self.rng.random_range(0..8) {
            // Longer than the column: errorStage is cut to 80, errorClass to 40 (§3.3).
            0 => format!("{short}_{}", "X".repeat(90 - short.len())),
            _ => short.to_string(),
        }
    }

    pub(super) fn message(&mut self) -> Option<String> {
        match self.rng.random_range(0..6) {
            0 => None,
            1 => Some(String::new()),
            2 => Some("naïve \"quoted\" message / ünïcode".into()),
            _ => Some("ORA-00000 something went wrong".into()),
        }
    }

    fn global(&mut self, model: &Model, c: &mut Vec<Choice>) {
        let active = model
            .runs
            .iter()
            .filter(|r| !is_terminal(&r.status()))
            .count();
        if model.runs.len() < 6 && active < 2 {
            let w = if active == 0 { 40 } else { 6 };
            let bk = self.business_key(model);
            let create = self.create(&bk);
            c.push((w, create));
        }
        if let Some(active_run) = model.runs.iter().find(|r| !is_terminal(&r.status())) {
            let bk = active_run.row.text("business_key").unwrap();
            let dup = self.create(&bk);
            c.push((2, dup));
        }
        if self.rng.random_bool(0.1) {
            let mut bad = self.create("2026-01-01");
            if let Op::Create { hdfs_root, .. } = &mut bad {
                *hdfs_root = "/data/../etc".into();
            }
            c.push((1, bad));
        }
        let job = self.job.clone();
        c.push((
            2,
            Op::CleanupCandidates {
                job: job.clone(),
                limit: self.rng.random_bool(0.3).then_some(1),
            },
        ));
        c.push((
            2,
            Op::ListRuns {
                job,
                business_key: self
                    .rng
                    .random_bool(0.3)
                    .then(|| self.keys.first().cloned())
                    .flatten(),
                status: self.rng.random_bool(0.2).then(|| "CANCELLED".to_string()),
                limit: self.rng.random_bool(0.3).then_some(2),
            },
        ));
        let missing = Target::Missing(uuid(&mut self.rng));
        let stray = match self.rng.random_range(0..4) {
            0 => Op::GetRun(missing, false),
            1 => Op::Cancel(missing, "operator says so".into()),
            2 => Op::Claim {
                run: missing,
                pid: "0000".into(),
                token: uuid(&mut self.rng),
                worker: "nifi-9".into(),
            },
            _ => Op::StageValidated(missing),
        };
        c.push((1, stray));
    }

    fn business_key(&mut self, model: &Model) -> String {
        let reusable: Vec<String> = self
            .keys
            .iter()
            .filter(|k| {
                model
                    .runs
                    .iter()
                    .filter(|r| r.row.text("business_key").as_ref() == Some(*k))
                    .all(|r| is_terminal(&r.status()))
            })
            .cloned()
            .collect();
        if !reusable.is_empty() && self.rng.random_bool(0.4) {
            return reusable[self.rng.random_range(0..reusable.len())].clone();
        }
        let k = format!(
            "2026-09-{:02}.k_{}",
            self.keys.len() + 1,
            self.rng.random_range(0..99)
        );
        self.keys.push(k.clone());
        k
    }

    fn create(&mut self, bk: &str) -> Op {
        let r = &mut self.rng;
        let hdfs_root = [
            "/data/nifi/stage/",
            "/data//nifi///stage",
            "/x",
            "/data/nifi/stage",
        ][r.random_range(0..4)]
        .to_string();
        let mut parameters = serde_json::Map::new();
        parameters.insert("trigger".into(), json!("SCHEDULE"));
        parameters.insert("allowEmptySource".into(), json!("overwritten"));
        Op::Create {
            job: self.job.clone(),
            business_key: bk.into(),
            hdfs_root,
            prefix: ["tmp_insp_dtl_", "Stage_", "t"][r.random_range(0..3)].into(),
            allow_empty: match r.random_range(0..4) {
                0 => None,
                1 => Some(false),
                _ => Some(true),
            },
            parameters: r.random_bool(0.5).then_some(parameters),
        }
    }

    fn for_run(&mut self, model: &Model, i: usize, c: &mut Vec<Choice>) {
        let rs = &model.runs[i];
        let t = Target::Run(i);
        let status = rs.status();
        c.push((1, Op::GetRun(t, self.rng.random_bool(0.5))));
        c.push((1, Op::Events(t, self.rng.random_bool(0.2).then_some(3))));
        c.push((1, Op::GetValidations(t)));
        let allow = rs.row.val("parameters")["allowEmptySource"]
            .as_bool()
            .unwrap_or(false);
        match status.as_str() {
            "CREATED" => {
                let m = bodies::manifest(&mut self.rng, allow);
                self.manifests.insert(i, m.clone());
                c.push((40, Op::Manifest(t, m)));
                c.push((
                    6,
                    Op::Manifest(t, bodies::broken_manifest(&mut self.rng, allow)),
                ));
                c.push((3, self.run_fail(t, "CREATED", "FAILED_MANIFEST")));
                c.push((3, Op::Cancel(t, "wrong business date".into())));
                c.push((
                    1,
                    Op::Claim {
                        run: t,
                        pid: "0007".into(),
                        token: uuid(&mut self.rng),
                        worker: "nifi-1".into(),
                    },
                ));
            }
            "EXTRACTING" => self.extracting(rs, i, c),
            "EXTRACTED_VALIDATED" => {
                let d = rs.dispatch_id("VALIDATE_RUN").unwrap_or_default();
                let node =
                    ["nifi-02".to_string(), String::new()][self.rng.random_range(0..2)].clone();
                c.push((
                    40,
                    Op::ValidationStart {
                        run: t,
                        dispatch: d,
                        node: self.rng.random_bool(0.7).then_some(node),
                    },
                ));
                c.push((3, Op::Cancel(t, "data owner asked".into())));
                c.push((2, Op::Resend(t, d)));
                c.push((
                    1,
                    self.run_fail(t, "EXTRACTED_VALIDATED", "FAILED_STAGE_VALIDATION"),
                ));
                c.push((1, Op::StageValidated(t)));
                self.late_chunk(rs, i, c);
            }
            "STAGE_VALIDATING" => {
                let n = rs.row.int("extracted_count").unwrap_or(0);
                let m = bodies::metrics(&mut self.rng, "STAGING", n);
                c.push((
                    25,
                    Op::Validations {
                        run: t,
                        stage: "STAGING".into(),
                        query_version: self.version(),
                        metrics: m,
                    },
                ));
                c.push((15, Op::StageValidated(t)));
                let d = rs.dispatch_id("VALIDATE_RUN").unwrap_or_default();
                c.push((
                    2,
                    Op::ValidationStart {
                        run: t,
                        dispatch: d,
                        node: None,
                    },
                ));
                c.push((
                    2,
                    self.run_fail(t, "STAGE_VALIDATING", "FAILED_STAGE_VALIDATION"),
                ));
                c.push((2, Op::Cancel(t, "stage looks wrong".into())));
                let m = bodies::metrics(&mut self.rng, "TARGET", n);
                c.push((
                    1,
                    Op::Validations {
                        run: t,
                        stage: "TARGET".into(),
                        query_version: None,
                        metrics: m,
                    },
                ));
            }
            "STAGING_VALIDATED" => {
                let token = uuid(&mut self.rng);
                self.publish.insert(i, token);
                c.push((30, Op::PublishClaim(t, token)));
                c.push((2, self.run_fail(t, "STAGING_VALIDATED", "FAILED_PUBLISH")));
                c.push((2, Op::Cancel(t, "publish window closed".into())));
                c.push((2, Op::StageValidated(t)));
                c.push((1, self.result(t, token, "PUBLISHED")));
            }
            "PUBLISHING" => {
                let token = rs
                    .row
                    .text("publish_token")
                    .and_then(|s| Uuid::parse_str(&s).ok())
                    .unwrap_or_default();
                c.push((20, self.result(t, token, "PUBLISHED")));
                c.push((4, self.result(t, token, "FAILED_PUBLISH")));
                c.push((5, self.result(t, token, "PUBLISH_UNKNOWN")));
                let rival = uuid(&mut self.rng);
                c.push((3, Op::PublishClaim(t, rival)));
                c.push((2, Op::PublishClaim(t, token)));
                c.push((2, self.result(t, rival, "PUBLISHED")));
                c.push((1, Op::Cancel(t, "too late to cancel".into())));
                c.push((1, self.run_fail(t, "PUBLISHED", "FAILED_TARGET_VALIDATION")));
            }
            "PUBLISHED" => {
                let n = rs.row.int("extracted_count").unwrap_or(0);
                let m = bodies::metrics(&mut self.rng, "TARGET", n);
                c.push((
                    20,
                    Op::Validations {
                        run: t,
                        stage: "TARGET".into(),
                        query_version: self.version(),
                        metrics: m,
                    },
                ));
                let target = opt(&mut self.rng, n);
                c.push((15, Op::Success(t, target)));
                c.push((2, self.run_fail(t, "PUBLISHED", "FAILED_TARGET_VALIDATION")));
                if let Some(token) = self.publish.get(&i).copied() {
                    c.push((2, self.result(t, token, "PUBLISHED")));
                }
            }
            "PUBLISH_UNKNOWN" => {
                c.push((
                    8,
                    Op::Resolve {
                        run: t,
                        resolution: "PUBLISHED".into(),
                        reason: "checked in Hive".into(),
                    },
                ));
                c.push((
                    8,
                    Op::Resolve {
                        run: t,
                        resolution: "FAILED_PUBLISH".into(),
                        reason: "target table untouched".into(),
                    },
                ));
                if let Some(token) = self.publish.get(&i).copied() {
                    c.push((2, self.result(t, token, "PUBLISHED")));
                }
                c.push((1, Op::Cancel(t, "cannot cancel this".into())));
            }
            _ => self.terminal(rs, i, c),
        }
    }

    pub(super) fn version(&mut self) -> Option<String> {
        [None, Some("v1".to_string()), Some("v2".to_string())][self.rng.random_range(0..3)].clone()
    }

    pub(super) fn run_fail(&mut self, t: Target, expected: &str, fail: &str) -> Op {
        let stage = self.text("STAGE");
        let message = self.message();
        Op::RunFail {
            run: t,
            expected: expected.into(),
            fail: fail.into(),
            stage,
            code: "HIVE_LOAD_FAILED".into(),
            message,
        }
    }

    pub(super) fn result(&mut self, t: Target, token: Uuid, outcome: &str) -> Op {
        let error_code = if outcome == "PUBLISHED" {
            Opt::Absent
        } else {
            opt(&mut self.rng, "TIMEOUT".to_string())
        };
        let message = self.message();
        Op::PublishResult {
            run: t,
            token,
            outcome: outcome.into(),
            error_code,
            message,
        }
    }
}
