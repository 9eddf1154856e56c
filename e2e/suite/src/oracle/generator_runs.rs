//! The generator's choices for runs that are extracting (claims, chunks in and out of order,
//! contending workers, stale tokens, gate flaws, path conflicts) and for ended runs (late
//! reports, resends, cleanups, refused operator actions).
use super::bodies::{self, opt, uuid};
use super::generator::{Choice, Generator, Work};
use super::model::{RowExt, RunState};
use super::request::{ChunkReq, Op, Opt, Target};
use rand::Rng;
use uuid::Uuid;

impl Generator {
    pub(super) fn extracting(&mut self, rs: &RunState, i: usize, c: &mut Vec<Choice>) {
        let t = Target::Run(i);
        let run_path = rs.row.text("hdfs_run_path").unwrap_or_default();
        for (pid, p) in &rs.partitions {
            let ps = p.text("status").unwrap_or_default();
            let key = (i, pid.clone());
            if ps == "PENDING" {
                let token = uuid(&mut self.rng);
                let worker = format!("nifi-0{}", self.rng.random_range(1..4));
                let expected = p.int("expected_row_count").unwrap_or(0);
                let plan = bodies::chunk_plan(&mut self.rng, &run_path, pid, expected, token);
                self.work.insert(
                    key.clone(),
                    Work {
                        token,
                        worker: worker.clone(),
                        plan,
                        sent: vec![],
                    },
                );
                c.push((
                    15,
                    Op::Claim {
                        run: t,
                        pid: pid.clone(),
                        token,
                        worker,
                    },
                ));
                continue;
            }
            let Some(w) = self.work.get(&key).cloned() else {
                continue;
            };
            let owner = p.text("claim_token") == Some(w.token.to_string());
            if ps == "RUNNING" && owner {
                let unsent: Vec<usize> =
                    (0..w.plan.len()).filter(|k| !w.sent.contains(k)).collect();
                if !unsent.is_empty() {
                    // Mostly in order; sometimes out of order (§12).
                    let k = if self.rng.random_bool(0.7) {
                        unsent[0]
                    } else {
                        unsent[self.rng.random_range(0..unsent.len())]
                    };
                    c.push((30, Op::Chunk(t, pid.clone(), w.plan[k].clone())));
                }
                let rival = uuid(&mut self.rng);
                c.push((
                    3,
                    Op::Claim {
                        run: t,
                        pid: pid.clone(),
                        token: rival,
                        worker: "nifi-rival".into(),
                    },
                ));
                c.push((
                    2,
                    Op::Claim {
                        run: t,
                        pid: pid.clone(),
                        token: w.token,
                        worker: w.worker.clone(),
                    },
                ));
                let mut stale = w.plan[0].clone();
                stale.token = rival;
                c.push((2, Op::Chunk(t, pid.clone(), stale)));
                let mut outside = w.plan[0].clone();
                outside.path = if self.rng.random_bool(0.5) {
                    format!("{run_path}/../other/part-0.parquet")
                } else {
                    format!("{run_path}_x/p={pid}/part-0.parquet")
                };
                c.push((1, Op::Chunk(t, pid.clone(), outside)));
                let mut range = w.plan[0].clone();
                range.index = range.count;
                c.push((1, Op::Chunk(t, pid.clone(), range)));
                c.push((2, self.partition_fail(t, pid, w.token)));
                c.push((1, self.partition_fail(t, pid, rival)));
            }
            if let Some(&k) = w.sent.first() {
                c.push((4, Op::Chunk(t, pid.clone(), w.plan[k].clone())));
                let mut changed = w.plan[k].clone();
                changed.records += 1;
                c.push((2, Op::Chunk(t, pid.clone(), changed)));
                if let Some(&other) = w.sent.iter().find(|&&o| o != k) {
                    // Another chunk's recorded path (uq_load_file_path).
                    let mut reuse = w.plan[k].clone();
                    reuse.path = w.plan[other].path.clone();
                    c.push((
                        if ps == "SUCCESS" { 4 } else { 1 },
                        Op::Chunk(t, pid.clone(), reuse),
                    ));
                }
            }
            if ps == "SUCCESS" {
                c.push((1, self.partition_fail(t, pid, w.token)));
            }
        }
        let m = self.manifests.get(&i).cloned();
        if let Some(m) = m {
            c.push((2, Op::Manifest(t, m.clone())));
            let mut changed = m;
            changed.source_count += 1;
            c.push((1, Op::Manifest(t, changed)));
        }
        c.push((2, self.run_fail(t, "EXTRACTING", "FAILED_EXTRACT")));
        c.push((2, Op::Cancel(t, "source reloaded".into())));
        let d = uuid(&mut self.rng);
        c.push((
            1,
            Op::ValidationStart {
                run: t,
                dispatch: d,
                node: None,
            },
        ));
    }

    fn partition_fail(&mut self, t: Target, pid: &str, token: Uuid) -> Op {
        let (class, code) = [
            ("SNAPSHOT", "ORA-01555"),
            ("SQL", "ORA-08180"),
            ("snapshot", "X1"),
            ("IO", "HDFS_WRITE"),
        ][self.rng.random_range(0..4)];
        let class = self.text(class);
        let stage = self.text("EXTRACT");
        let message = self.message();
        let n = self.rng.random_range(0..5);
        let attempt = opt(&mut self.rng, n);
        Op::PartitionFail {
            run: t,
            pid: pid.into(),
            token,
            stage,
            class,
            code: code.into(),
            message,
            attempt,
        }
    }

    /// A chunk replay after the extraction ended (recorded only, §4.7 step 9).
    pub(super) fn late_chunk(&mut self, _rs: &RunState, i: usize, c: &mut Vec<Choice>) {
        let late: Vec<(String, ChunkReq)> = self
            .work
            .iter()
            .filter(|((r, _), w)| *r == i && !w.sent.is_empty())
            .map(|((_, pid), w)| (pid.clone(), w.plan[w.sent[0]].clone()))
            .collect();
        if let Some((pid, chunk)) = late.first() {
            c.push((1, Op::Chunk(Target::Run(i), pid.clone(), chunk.clone())));
        }
    }

    pub(super) fn terminal(&mut self, rs: &RunState, i: usize, c: &mut Vec<Choice>) {
        let t = Target::Run(i);
        let operator = self.rng.random_bool(0.5);
        let dropped = opt(
            &mut self.rng,
            rs.row.text("stage_table_name").unwrap_or_default(),
        );
        let deleted = opt(
            &mut self.rng,
            rs.row.text("hdfs_run_path").unwrap_or_default(),
        );
        c.push((
            2,
            Op::Cleanup {
                run: t,
                dropped,
                deleted,
                operator,
            },
        ));
        for d in &rs.dispatches {
            let id = d
                .text("dispatch_id")
                .and_then(|s| Uuid::parse_str(&s).ok())
                .unwrap_or_default();
            c.push((2, Op::Resend(t, id)));
            c.push((
                1,
                Op::ValidationStart {
                    run: t,
                    dispatch: id,
                    node: Some("nifi-late".into()),
                },
            ));
        }
        if let Some(pid) = rs.partitions.keys().next() {
            c.push((
                1,
                Op::Claim {
                    run: t,
                    pid: pid.clone(),
                    token: uuid(&mut self.rng),
                    worker: "nifi-late".into(),
                },
            ));
        }
        self.late_chunk(rs, i, c);
        let status = rs.status();
        let pair = match status.as_str() {
            "FAILED_MANIFEST" => Some("CREATED"),
            "FAILED_EXTRACT" => Some("EXTRACTING"),
            "FAILED_STAGE_VALIDATION" => Some("STAGE_VALIDATING"),
            "FAILED_PUBLISH" => Some("STAGING_VALIDATED"),
            "FAILED_TARGET_VALIDATION" => Some("PUBLISHED"),
            _ => None,
        };
        if let Some(expected) = pair {
            c.push((1, self.run_fail(t, expected, &status)));
        }
        c.push((1, Op::Cancel(t, "again please".into())));
        c.push((1, Op::Success(t, Opt::Absent)));
        c.push((
            1,
            Op::Resolve {
                run: t,
                resolution: "FAILED_PUBLISH".into(),
                reason: "late resolution".into(),
            },
        ));
        c.push((1, Op::PublishClaim(t, uuid(&mut self.rng))));
    }
}
