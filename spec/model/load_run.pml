/*
 * The run protocol of load-control, for the spin model checker.
 *
 * What is modelled: one run and every ledger decision that moves it (CONTRACT §2, §4, §5, §6, §7),
 * the NiFi flows, workers, dispatcher replicas, sweeper and operators that ask for those decisions.
 * docs/model.md explains the abstraction, the bounds and how to run it (scripts/model-check).
 *
 * One `atomic` block = one ledger transaction, except a chunk report that passes the gate: its
 * completion decision (pin a sibling, or lock the run row and recount) is a second step, between
 * which sibling reports may run, as they may in PostgreSQL (§5.3 rule 3; spec/model/completion.pml
 * checks that decision statement by statement). The ledger's locking (§3.10, §5.3) makes committed
 * transactions serializable in effect (§5.3 rule 4); whether the SQL really achieves that is proven
 * by the concurrency tests against PostgreSQL, not here. The model checks the protocol above it:
 * that the compare-and-set guards give the §11 guarantees under every interleaving.
 *
 * The environment is adversarial: every request a NiFi flow, worker or operator could send can
 * arrive at any time, with any claim token ever handed out. That covers duplicated, late and
 * reordered messages, lost responses (the client retries), crashed workers (they never send again)
 * and stale owners. Dispatcher replicas crash after a lease, leaders are deposed while they work,
 * the sweeper sees any RUNNING partition as stale and any run past its deadline at any moment.
 *
 * Each transaction carries a tag `@op <ledger operation>` and the `@event`s it writes;
 * ledger/tests/model_mapping.rs maps them to the ledger and fails when the ledger gains an
 * operation, an event or a status that the model lacks. Each `MUTANT_*` removes one guard; the
 * same test ties it to the ledger code that implements the guard, and scripts/model-check checks
 * that spin catches it with the property named there (`@property` tags on the assertions).
 */

/* ---------------------------------------------------------------- bounds */
#ifndef P
#define P 2             /* partitions */
#endif
#ifndef W
#define W 2             /* workers: each holds one claim token at a time */
#endif
#ifndef D
#define D 2             /* dispatcher/sweeper replicas; only the leader writes */
#endif
#ifndef MAX_ATTEMPTS
#define MAX_ATTEMPTS 2  /* recovery.max_attempts: claims per partition */
#endif
#ifndef DISPATCH_MAX
#define DISPATCH_MAX 2  /* dispatch.max_attempts */
#endif
#ifndef EPOCHS
#define EPOCHS 2        /* leader acquisitions: 2 = the first leader is deposed once */
#endif
#ifndef RESENDS
#define RESENDS 1       /* operator resends */
#endif
#ifndef C
#define C 1             /* chunks per partition (chunkCount) */
#endif
#define TOKENS (W + MAX_ATTEMPTS - 1)   /* claim tokens handed out in total */
#define ROWS (P + 1)    /* outbox rows: 0 = VALIDATE_RUN, 1 + p = REISSUE_PARTITION of p */
#define PUB_TOKENS 2    /* publish tokens (two PG-60 instances) */

/* ---------------------------------------------------------------- states (ledger/src/status.rs) */
#define R_NONE 0
#define CREATED 1
#define EXTRACTING 2
#define EXTRACTED_VALIDATED 3
#define STAGE_VALIDATING 4
#define STAGING_VALIDATED 5
#define PUBLISHING 6
#define PUBLISHED 7
#define PUBLISH_UNKNOWN 8
#define SUCCESS 9
#define FAILED_MANIFEST 10
#define FAILED_EXTRACT 11
#define FAILED_STAGE_VALIDATION 12
#define FAILED_PUBLISH 13
#define FAILED_TARGET_VALIDATION 14
#define FAILED_SNAPSHOT_EXPIRED 15
#define TIMED_OUT 16
#define CANCELLED 17
/* RUN_TRANSITION(a, b): the run state machine's table, generated from ledger/src/machine.rs, the
   same rows as the database's nifi_ops.run_transition (ledger/tests/run_machine.rs). */
#include "run_transitions.pml"
#define ACTIVE(s) ((s) >= CREATED && (s) <= PUBLISH_UNKNOWN)
#define TERMINAL(s) ((s) >= SUCCESS)
#define FAILABLE(s) ((s) == CREATED || (s) == EXTRACTING || (s) == STAGE_VALIDATING || (s) == STAGING_VALIDATED || (s) == PUBLISHED)
#ifdef MUTANT_CANCEL_PUBLISHING
#define CANCELLABLE(s) ((s) >= CREATED && (s) <= PUBLISHING)
#else
#define CANCELLABLE(s) ((s) >= CREATED && (s) <= STAGING_VALIDATED)
#endif

#define PT_NONE 0
#define PT_PENDING 1
#define PT_RUNNING 2
#define PT_RETRY 3
#define PT_SUCCESS 4
#define PT_FAILED 5
#define PT_TIMED_OUT 6
#define PT_ABORTED 7
#define UNFINISHED(s) ((s) >= PT_PENDING && (s) <= PT_RETRY)

#define DS_NONE 0
#define DS_PENDING 1
#define DS_SENT 2
#define DS_ACKED 3
#define DS_DEAD 4

/* what a send got back (§6.5) */
#define SEND_NONE 0
#define SEND_2XX 1
#define SEND_RETRYABLE 2
#define SEND_REFUSED 3

/* load_file.status */
#define CS_NONE 0
#define CS_WRITTEN 1
#define CS_FAILED 2

/* a PG-40 flow, started by a validation start answered started=true */
#define FL_NONE 0
#define FL_STARTED 1
#define FL_PREPARED 2       /* it has (re)created the stage table: empty */
#define FL_LOADED 3         /* it has loaded the extract into it */
#define FL_DONE 4           /* its stage validation passed and it reported stage_validated */

/* what a publish claimant's INSERT OVERWRITE told it */
#define OW_NONE 0
#define OW_PUBLISHED 1
#define OW_FAILED 2
#define OW_CUT_OFF 3

/* ---------------------------------------------------------------- the ledger */
byte rstat;                 /* load_run.status */
byte run2;                  /* a second run of the same (jobKey, businessKey): R_NONE or CREATED */
byte success_count;         /* load_run.success_partition_count as stored: by the manifest, the
                               completion and every transition out of EXTRACTING (a recount);
                               while EXTRACTING it is read as the count of SUCCESS partitions */
byte extracted;             /* load_run.extracted_count (rows in units: 1 per non-empty partition) */
byte source;                /* load_run.source_count */
byte part[P];               /* load_partition.status */
byte ptoken[P];             /* load_partition.claim_token (0 = NULL) */
byte pattempt[P];           /* load_partition.attempt_count */
bit pzero[P];               /* expectedRowCount = 0 */
byte cstat[P * C];          /* load_file.status of chunk i of partition p, at p * C + i */
byte cowner[P * C];         /* the claim token whose report wrote that chunk: its content */
byte dstat[ROWS];           /* load_dispatch.status */
/* The VALIDATE_RUN row goes through the dispatcher step by step (lease, send, outcome). The
   REISSUE_PARTITION rows take the same code path; the model sends them in one abstract step, so
   that their attempts and leases do not multiply the state space. */
byte datt;                  /* load_dispatch.attempt_count of VALIDATE_RUN */
byte dlease;                /* 0, or r + 1 while replica r holds an unexpired lease on it */
byte dlease_epoch;          /* load_dispatch.leased_epoch: the epoch that lease was taken in */
bit delivered;              /* PG-05 has received VALIDATE_RUN */
byte pub_token;             /* load_run.publish_token (0 = NULL) */
byte epoch;                 /* leader_epoch.epoch */
bit mode_reissue;           /* recovery.mode = REISSUE (else FAIL) */

/* ---------------------------------------------------------------- the actors */
byte next_token;            /* claim tokens 1 .. next_token have been handed out to workers */
byte rep_epoch[D];          /* the epoch replica r believes it leads with (0 = follower) */
bit rep_row[D];             /* replica r has leased VALIDATE_RUN and not yet recorded the outcome */
byte rep_send[D];           /* SEND_*: what replica r's send of that row got back */
byte resends;               /* operator resends so far */
byte inflight;              /* chunk reports between their partition's success and their commit */
bit inc[P];                 /* report of p: partition SUCCESS written, not yet committed */
bit naive[P];               /* MUTANT_NO_PIN: a sibling looked unfinished when p's gate passed */
byte claimant_seen[PUB_TOKENS + 1]; /* OW_*: what claimant k's INSERT OVERWRITE told it */

/* ---------------------------------------------------------------- ghosts (for the properties) */
byte g_completions;         /* completion CAS wins = responses with validationScheduled=true */
byte g_vr_inserts;          /* VALIDATE_RUN rows inserted */
byte g_starts;              /* validation/start answered started=true */
byte g_pub_claims;          /* bitmask of publish tokens answered claimed=true */
byte g_overwrites;          /* INSERT OVERWRITEs run by claimants answered claimed=true */
bit g_landed;               /* the target table holds the run's data */
bit g_false_outcome;        /* a publish result report recorded what the overwrite did not do */
bit g_acked;                /* VALIDATE_RUN has been ACKED */
bit g_deposed_write;        /* a leader transaction wrote while its epoch was not the current one */
byte g_resolutions;         /* resolves answered changed=true */
bit g_succeeded[P];         /* the partition has been SUCCESS */
bit g_ended_extract;        /* the run entered FAILED_EXTRACT or FAILED_SNAPSHOT_EXPIRED */
bit g_rearmed[ROWS];        /* an operator resent the row after the run ended (§4.15 allows it) */
byte g_prev;                /* run status after the previous transaction */
bit g_resolving;            /* the transaction running is an operator's resolve */
byte g_prev_part[P];        /* partition statuses after the previous transaction */
byte fl[2];                 /* FL_*: the PG-40 flow of the first and of a second validation start */
byte stage;                 /* the stage table: complete copies of the extract it holds (0, 1, 2+) */
bit g_bad_stage;            /* an INSERT OVERWRITE copied a stage table other than one complete load */

hidden byte h_i, h_n, h_rows;

/* ---------------------------------------------------------------- shared steps */

#ifdef MUTANT_NO_ABORT
#define MUTANT_KEEP_PARTITIONS && false
#else
#define MUTANT_KEEP_PARTITIONS
#endif

/* The committed SUCCESS partitions: a sibling report's success is not visible before it commits. */
inline count_successes() {
    h_n = 0;
    h_rows = 0;
    for (h_i : 0 .. P - 1) {
        if
        :: part[h_i] == PT_SUCCESS && !inc[h_i] -> h_n++; h_rows = h_rows + 1 - pzero[h_i]
        :: else
        fi
    }
}

/* §2.2: entering a terminal status other than SUCCESS and TIMED_OUT aborts unfinished partitions;
   entering any terminal status settles PENDING and SENT dispatches as DEAD. */
inline end_run(to) {
    count_successes();
    if
    :: rstat == EXTRACTING -> success_count = h_n                     /* leaving EXTRACTING: the recount */
    :: else
    fi;
    rstat = to;
    if
    :: to != TIMED_OUT && to != SUCCESS MUTANT_KEEP_PARTITIONS ->
        for (h_i : 0 .. P - 1) {
            if
            :: UNFINISHED(part[h_i]) -> part[h_i] = PT_ABORTED
            :: else
            fi
        }
    :: else
    fi;
    for (h_i : 0 .. ROWS - 1) {
        if
        :: dstat[h_i] == DS_PENDING || dstat[h_i] == DS_SENT -> dstat[h_i] = DS_DEAD
        :: else
        fi
    }
}

/* §7.2 rules 1 and 2: the sweeper's timeouts close unfinished partitions as TIMED_OUT. */
inline time_out_run() {
    for (h_i : 0 .. P - 1) {
        if
        :: UNFINISHED(part[h_i]) -> part[h_i] = PT_TIMED_OUT
        :: else
        fi
    }
    end_run(TIMED_OUT)
}

/* §5.4: a success that pinned no sibling locked the run row: the recount CAS. */
inline completion_cas() {
    count_successes();
    if
    :: rstat == EXTRACTING && h_n == P && h_rows == source ->
        rstat = EXTRACTED_VALIDATED;
        success_count = h_n;
        extracted = h_rows;
        g_completions++;
        if
        :: dstat[0] == DS_NONE ->       /* ON CONFLICT (run_id) WHERE VALIDATE_RUN DO NOTHING */
            dstat[0] = DS_PENDING; datt = 0; delivered = 0; g_vr_inserts++
        :: else
        fi
    :: else
    fi
}

/* §7.2 rule 3: the run still waits for the row's acknowledgement. */
#define AWAITED(row) ((row == 0 && rstat == EXTRACTED_VALIDATED) || (row > 0 && rstat == EXTRACTING && part[row - 1] == PT_RETRY))

/* A leader transaction starts with the fence (§7.1): a stale epoch writes nothing. Every leader
   path (the dispatcher's lease, its outcome, the sweeper's tick) is run by a replica, which may
   have been deposed without knowing it; each path's fence has its own mutant. */
#define CURRENT(r) (rep_epoch[r] != 0 && rep_epoch[r] == epoch)
#ifdef MUTANT_NO_LEASE_FENCE
#define LEASE_FENCE(r) (rep_epoch[r] != 0)
#else
#define LEASE_FENCE(r) CURRENT(r)
#endif
#ifdef MUTANT_NO_OUTCOME_FENCE
#define OUTCOME_FENCE(r) (rep_epoch[r] != 0)
#else
#define OUTCOME_FENCE(r) CURRENT(r)
#endif
#ifdef MUTANT_NO_SWEEP_FENCE
#define SWEEP_FENCE(r) (rep_epoch[r] != 0)
#else
#define SWEEP_FENCE(r) CURRENT(r)
#endif
/* The outcome of a send is written only while the row is still PENDING: an early ACK stays. */
#ifdef MUTANT_NO_CONDITIONAL_OUTCOME
#define OUTCOME_CAS (dstat[0] != DS_NONE)
#else
#define OUTCOME_CAS (dstat[0] == DS_PENDING)
#endif
/* A reissue invalidates the partition's WRITTEN chunks (§2.3): the next owner starts afresh. */
#ifdef MUTANT_NO_INVALIDATE
#define INVALIDATED CS_WRITTEN
#else
#define INVALIDATED CS_FAILED
#endif

/* Ghost of guarantee 19, set by every leader transaction that writes. */
inline leader_wrote(r) {
    g_deposed_write = g_deposed_write || rep_epoch[r] != epoch
}

#ifdef MUTANT_NO_START_CAS
#define MUTANT_START_AGAIN (rstat == STAGE_VALIDATING && g_starts < 2)
#else
#define MUTANT_START_AGAIN false
#endif

/* The properties that restate a guard (3 and 14: the abort; 9: the start CAS; 19: the fences) can
   be switched off with -DOFF_<n>, so that a mutant's check shows that a property observing the
   harm downstream (13-partitions, 9-stage) catches it too (scripts/model-check). With 19 off, the
   fence mutants violate nothing: docs/model.md says why they are kept for 19 alone. */
#ifndef OFF_3
#define OFF_3 0
#endif
#ifndef OFF_9
#define OFF_9 0
#endif
#ifndef OFF_14
#define OFF_14 0
#endif
#ifndef OFF_19
#define OFF_19 0
#endif

/* ---------------------------------------------------------------- the §11 guarantees */
/* Each assertion carries `@property <name>` on its line: scripts/model-check reads the line of a
   violation from spin's trail and names the property that fired. */
inline check() {
    /* 1, 2: at most one active run per key; PUBLISH_UNKNOWN counts as active */
    assert(!(run2 == CREATED && ACTIVE(rstat)));                                  /* @property 1 */
    /* 13: terminal runs are never revived */
    assert(!TERMINAL(g_prev) || rstat == g_prev);                                 /* @property 13 */
    /* 11: only an operator's resolve leaves PUBLISH_UNKNOWN */
    assert(!(g_prev == PUBLISH_UNKNOWN && rstat != PUBLISH_UNKNOWN) || g_resolving); /* @property 11 */
    /* 6, 7: at most one completion decision and one VALIDATE_RUN row ... */
    assert(g_completions <= 1 && g_vr_inserts <= 1);                             /* @property 6-at-most-one */
    count_successes();
    /* ... and at least one: once every partition's success has committed, the run has left
       EXTRACTING (it completed, in the transaction of the last success) */
    assert(!(rstat == EXTRACTING && inflight == 0 && h_n == P));                 /* @property 6-at-least-one */
    assert(rstat <= EXTRACTING || rstat == FAILED_MANIFEST || rstat == FAILED_EXTRACT
           || rstat == FAILED_SNAPSHOT_EXPIRED || rstat == TIMED_OUT || rstat == CANCELLED
           || g_completions == 1);                                              /* @property 6-completed */
    /* 8: completion and extract failure never both happen */
    assert(!(g_ended_extract && g_completions > 0));                             /* @property 8 */
    assert(!g_ended_extract || dstat[0] == DS_NONE);                             /* @property 8-no-row */
    /* 9: one validation start (PG-40 prepares the stage table once) */
    assert(OFF_9 || g_starts <= 1);                                             /* @property 9 */
    /* 9, downstream: the INSERT OVERWRITE publishes the stage table that stage validation passed,
       one complete load of the extract; a second PG-40 flow re-creating or re-loading it breaks that */
    assert(!g_bad_stage);                                                       /* @property 9-stage */
    /* 10: one publish claimant: one INSERT OVERWRITE runs, and the recorded outcome is what it did */
    assert(g_overwrites <= 1);                                                  /* @property 10-one-overwrite */
    assert(!g_false_outcome);                                                   /* @property 10-true-outcome */
    /* 12: one resolution */
    assert(g_resolutions <= 1);                                                 /* @property 12 */
    /* 16: counters agree with the committed partition rows (the count as read: computed while
       EXTRACTING, stored afterwards); extracted_count is 0 until the completion, then source_count */
    assert(rstat == CREATED || rstat == FAILED_MANIFEST || rstat == EXTRACTING || success_count == h_n); /* @property 16 */
    assert((g_completions == 0 && extracted == 0)
           || (g_completions == 1 && extracted == source && h_rows == source));  /* @property 16-extracted */
    for (h_i : 0 .. P - 1) {
        /* 14, 15: a terminal run leaves no unfinished partition */
        assert(OFF_14 || !TERMINAL(rstat) || !UNFINISHED(part[h_i]));           /* @property 14 */
        /* 13, downstream of 14: an ended run's partitions are final too; no late report or /fail
           of a worker decides one of them after the run's verdict */
        assert(!TERMINAL(g_prev) || part[h_i] == g_prev_part[h_i]);             /* @property 13-partitions */
        g_prev_part[h_i] = part[h_i];
        /* 5: a succeeded partition never changes */
        assert(!g_succeeded[h_i] || part[h_i] == PT_SUCCESS);                   /* @property 5 */
        /* 3: a RUNNING partition has exactly one owner token, a RETRY partition none */
        assert(part[h_i] != PT_RUNNING || (ptoken[h_i] != 0 && (OFF_3 || rstat == EXTRACTING))); /* @property 3 */
        assert(part[h_i] != PT_RETRY || ptoken[h_i] == 0);                      /* @property 3-retry */
        /* 4: a succeeded partition's data is its owner's: every chunk the gate counted was written
           by the claim that succeeded, none by a superseded owner */
        if
        :: part[h_i] == PT_SUCCESS && !pzero[h_i] ->
            for (h_n : 0 .. C - 1) {
                assert(cstat[h_i * C + h_n] == CS_WRITTEN && cowner[h_i * C + h_n] == ptoken[h_i]); /* @property 4 */
            }
        :: else
        fi
    }
    for (h_i : 0 .. ROWS - 1) {
        /* 14: ... and no PENDING or SENT dispatch, unless an operator resent one since */
        assert(!TERMINAL(rstat) || (dstat[h_i] != DS_PENDING && dstat[h_i] != DS_SENT) || g_rearmed[h_i]); /* @property 14-dispatches */
    }
    /* 18: VALIDATE_RUN is SENT only when PG-05 has it; an ACK stays (ACKED is final, §2.5) */
    assert(dstat[0] != DS_SENT || delivered);                                    /* @property 18-sent */
    assert(!g_acked || dstat[0] == DS_ACKED);                                    /* @property 18-acked */
    /* 19: a deposed leader writes nothing */
    assert(OFF_19 || !g_deposed_write);                                         /* @property 19 */
    /* every status change is a row of the state machine's table; the manifest of a run whose
       partitions all expect 0 rows makes two in one transaction (CREATED→EXTRACTING→EXTRACTED_VALIDATED) */
    assert(rstat == g_prev || RUN_TRANSITION(g_prev, rstat)
           || (g_prev == CREATED && rstat == EXTRACTED_VALIDATED));              /* @property transitions */
    g_prev = rstat;
    g_resolving = 0
}

/* ---------------------------------------------------------------- PG-20 workers */

/* §4.6 claim with a token never used before; a RETRY partition's REISSUE_PARTITION rows are ACKED. */
inline claim_new(p) {
    atomic {
        /* @op claim_partition @event PARTITION_STARTED */
        rstat == EXTRACTING && (part[p] == PT_PENDING || part[p] == PT_RETRY) && next_token < TOKENS ->
        if
        :: part[p] == PT_RETRY && dstat[1 + p] != DS_NONE -> dstat[1 + p] = DS_ACKED
        :: else
        fi;
        next_token++;
        part[p] = PT_RUNNING; ptoken[p] = next_token; pattempt[p]++;
        check()
    }
}

/* §4.6 claim retried with a token handed out before (its first answer was lost): it wins only when
   the partition is claimable again. Same-token replays of a RUNNING claim change nothing. */
inline claim_again(p, t) {
    atomic {
        /* @op claim_partition @event PARTITION_STARTED */
        rstat == EXTRACTING && (part[p] == PT_PENDING || part[p] == PT_RETRY) && t <= next_token ->
        if
        :: part[p] == PT_RETRY && dstat[1 + p] != DS_NONE -> dstat[1 + p] = DS_ACKED
        :: else
        fi;
        part[p] = PT_RUNNING; ptoken[p] = t; pattempt[p]++;
        check()
    }
}

/* The report's token check (§4.7 step 3, §11 #4): only the partition's current owner writes. */
#ifdef MUTANT_NO_TOKEN_CHECK
#define OWNS(p, t) (t != 0)
#else
#define OWNS(p, t) (ptoken[p] == t)
#endif

/* A success pins an unfinished sibling that no other transaction holds (FOR KEY SHARE SKIP
   LOCKED): a sibling whose success is in flight holds its row FOR UPDATE and is skipped. The
   naive check (MUTANT_NO_PIN) reads the siblings' committed statuses instead, at its gate, where a
   sibling whose success is in flight still looks unfinished, and leaves when it sees one. */
#ifdef MUTANT_NO_PIN
#define SIBLING(p, q) (q != p && (UNFINISHED(part[q]) || inc[q]))
#else
#define SIBLING(p, q) (q != p && UNFINISHED(part[q]))
#endif
#if P > 1
#define SIBLING_1(p) || SIBLING(p, 1)
#else
#define SIBLING_1(p)
#endif
#if P > 2
#define SIBLING_2(p) || SIBLING(p, 2)
#else
#define SIBLING_2(p)
#endif
#define PINS(p) (SIBLING(p, 0) SIBLING_1(p) SIBLING_2(p))
#ifdef MUTANT_NO_PIN
#define READ_SIBLINGS(p) naive[p] = PINS(p)
#define NOT_LAST(p) naive[p]
#else
#define READ_SIBLINGS(p) skip
#define NOT_LAST(p) PINS(p)
#endif

/* §4.7 a report of chunk i (of C) from token t: the chunk row takes t's content (UPSERT; a FAILED
   row flips back to WRITTEN). When the partition's WRITTEN chunks are complete the gate judges
   them: success is a CAS that also requires the reporter's claim token; a mismatch ends the run.
   Reports with another token are 409 CLAIM_MISMATCH and change nothing, as do identical replays
   (changed ones to a SUCCESS partition are 409 CHUNK_CONFLICT, rolled back) and late reports
   after the run ended (recorded only, for cleanup accounting; no verdict). A success leaves the
   transaction open: the run's conditional increment follows (report_commit), and sibling reports
   of other partitions may run in between (they hold the run row FOR KEY SHARE too, §5.3). */
inline report_chunk(p, t, i) {
    atomic {
        /* @op report_chunk @event PARTITION_SUCCESS @event PARTITION_FAILED @event RUN_FAILED */
        part[p] == PT_RUNNING && !inc[p] && OWNS(p, t) && !(cstat[p * C + i] == CS_WRITTEN && cowner[p * C + i] == t) ->
        cstat[p * C + i] = CS_WRITTEN; cowner[p * C + i] = t;
        h_n = 0;
        for (h_i : 0 .. C - 1) {
            if
            :: cstat[p * C + h_i] == CS_WRITTEN -> h_n++
            :: else
            fi
        }
        if
        :: h_n == C && ptoken[p] == t && rstat == EXTRACTING ->
            if
            :: part[p] = PT_SUCCESS; g_succeeded[p] = 1;       /* the gate passes */
               inc[p] = 1; inflight++; READ_SIBLINGS(p)
            :: inflight == 0 ->                                /* mismatch: the re-run under FOR */
               part[p] = PT_FAILED; g_ended_extract = 1;       /* UPDATE waits for the siblings */
               end_run(FAILED_EXTRACT)
            fi
        :: else                              /* incomplete, or the run has ended: recorded only */
        fi;
        check()
    }
}

/* §5.3 rule 3, §5.4: the success pins an unfinished sibling and commits without the run row (that
   sibling's success, later, will see this one); or, finding none, it locks the run row, recounts
   (a statement whose snapshot follows that wait) and runs the completion CAS; then the commit. */
inline report_commit(p) {
    atomic {
        /* @op report_chunk @event EXTRACT_VALIDATED */
        inc[p] ->
        inc[p] = 0; inflight--;
        if
        :: NOT_LAST(p) -> skip
        :: else -> completion_cas()
        fi;
        check()
    }
}

/* §4.8 the final failure of the claim held by token t (run row FOR UPDATE: no report in flight). */
inline fail_partition(p, t) {
    atomic {
        /* @op fail_partition @event PARTITION_FAILED @event RUN_FAILED */
        part[p] == PT_RUNNING && ptoken[p] == t && inflight == 0 ->
        part[p] = PT_FAILED;
        if
        :: rstat == EXTRACTING ->
            g_ended_extract = 1;
            if
            :: end_run(FAILED_EXTRACT)
            :: end_run(FAILED_SNAPSHOT_EXPIRED)               /* ORA-01555, ORA-08180, SNAPSHOT */
            fi
        :: else                                             /* the run has ended: only the partition */
        fi;
        check()
    }
}

/* Every request of a worker, as options of the world's loop. */
#if C > 1
#define REPORTS(p, t) :: report_chunk(p, t, 0) :: report_chunk(p, t, 1)
#else
#define REPORTS(p, t) :: report_chunk(p, t, 0)
#endif
#define WORKER_TOKEN(p, t) :: claim_again(p, t) REPORTS(p, t) :: fail_partition(p, t)
#if TOKENS > 2
#define WORKER_TOKEN_3(p) WORKER_TOKEN(p, 3)
#else
#define WORKER_TOKEN_3(p)
#endif
#if TOKENS > 3
#define WORKER_TOKEN_4(p) WORKER_TOKEN(p, 4)
#else
#define WORKER_TOKEN_4(p)
#endif
#define WORKER_REQUESTS(p) :: claim_new(p) WORKER_TOKEN(p, 1) WORKER_TOKEN(p, 2) WORKER_TOKEN_3(p) WORKER_TOKEN_4(p) :: report_commit(p)

/* ---------------------------------------------------------------- dispatcher replicas (§6) */

inline lease(r) {
    atomic {
        /* @op lease_dispatches */
        /* due: not leased, or leased in an older epoch (its leader is deposed: due at once) */
        LEASE_FENCE(r) && !rep_row[r] && dstat[0] == DS_PENDING && (dlease == 0 || dlease_epoch < rep_epoch[r]) ->
        datt++; dlease = r + 1; dlease_epoch = rep_epoch[r]; rep_row[r] = 1; rep_send[r] = SEND_NONE;
        leader_wrote(r);
        check()
    }
}

inline send(r) {
    atomic {
        /* @op dispatch_request (reads the leased row; then the HTTP send, outside any transaction) */
        rep_row[r] && rep_send[r] == SEND_NONE ->
        if
        :: delivered = 1; rep_send[r] = SEND_2XX
        :: delivered = 1; rep_send[r] = SEND_RETRYABLE       /* answer lost, or 5xx */
        :: rep_send[r] = SEND_RETRYABLE                       /* transport error */
        :: rep_send[r] = SEND_REFUSED                         /* 4xx */
        fi;
        check()
    }
}

inline record_outcome(r) {
    atomic {
        /* @op record_dispatch_outcome @event DISPATCH_DEAD */
        rep_row[r] && rep_send[r] != SEND_NONE ->
        if
        :: OUTCOME_FENCE(r) && OUTCOME_CAS ->
            leader_wrote(r);
            if
            :: rep_send[r] == SEND_2XX -> dstat[0] = DS_SENT
            :: rep_send[r] == SEND_RETRYABLE && datt >= DISPATCH_MAX -> dstat[0] = DS_DEAD
            :: rep_send[r] == SEND_RETRYABLE && datt < DISPATCH_MAX -> skip   /* backoff */
            :: rep_send[r] == SEND_REFUSED -> dstat[0] = DS_DEAD
            fi;
            dlease = 0; dlease_epoch = 0
        :: else                                             /* not PENDING, or deposed: no write */
        fi;
        rep_row[r] = 0; rep_send[r] = SEND_NONE;
        check()
    }
}

inline crash(r) {
    atomic {
        /* @env the replica dies after its lease, before or after sending */
        rep_row[r] -> rep_row[r] = 0; rep_send[r] = SEND_NONE; check() }
}

inline acquire(r) {
    atomic {
        /* @op acquire_epoch: the replica becomes leader; the old leader is not told */
        epoch < EPOCHS && !CURRENT(r) -> epoch++; rep_epoch[r] = epoch; check()
    }
}


/* dispatch.lease passes. A live sender sends and records within its lease (HTTP timeout <
   dispatch.lease), so only the lease of a sender that died or finished expires. */
inline lease_expires() {
    atomic {
        /* @env dispatch.lease passes */
        dlease != 0 && !rep_row[dlease - 1] -> dlease = 0; dlease_epoch = 0; check() }
}

/* A REISSUE_PARTITION row, leased, sent and recorded in one step by replica r. */
inline send_reissue(r, p) {
    atomic {
        /* @op lease_dispatches @op dispatch_request @op record_dispatch_outcome @event DISPATCH_DEAD */
        LEASE_FENCE(r) && OUTCOME_FENCE(r) && dstat[1 + p] == DS_PENDING ->
        leader_wrote(r);
        if
        :: dstat[1 + p] = DS_SENT                           /* PG-20 answered 2xx */
        :: dstat[1 + p] = DS_DEAD                           /* refused, or attempts exhausted */
        fi;
        check()
    }
}

/* ---------------------------------------------------------------- the sweeper (§7.2) */

inline stale_partition(r, p) {
    atomic {
        /* @op sweep.stale_partitions @event RECOVERY_REISSUED @event RUN_TIMED_OUT */
        SWEEP_FENCE(r) && rstat == EXTRACTING && part[p] == PT_RUNNING && inflight == 0 ->
        leader_wrote(r);
        if
        :: mode_reissue && pattempt[p] < MAX_ATTEMPTS ->
            /* 17: one reissue per claim (the reset clears the token, only a new claim sets one);
               the claim ACKed the previous reissue's row */
            assert(ptoken[p] != 0 && (dstat[1 + p] == DS_NONE || dstat[1 + p] == DS_ACKED));
            part[p] = PT_RETRY; ptoken[p] = 0;
            for (h_i : 0 .. C - 1) {
                if
                :: cstat[p * C + h_i] == CS_WRITTEN -> cstat[p * C + h_i] = INVALIDATED
                :: else
                fi
            }
            dstat[1 + p] = DS_PENDING
        :: else -> time_out_run()                           /* FAIL mode, or attempts exhausted */
        fi;
        check()
    }
}

inline unacked(r, row) {
    atomic {
        /* @op sweep.unacked_dispatches @event DISPATCH_REQUEUED @event DISPATCH_DEAD */
        SWEEP_FENCE(r) && dstat[row] == DS_SENT && AWAITED(row) ->
        leader_wrote(r);
        if
        :: row == 0 && datt < DISPATCH_MAX -> dstat[0] = DS_PENDING; dlease = 0; dlease_epoch = 0
        :: row == 0 && datt >= DISPATCH_MAX -> dstat[0] = DS_DEAD
        :: row > 0 -> dstat[row] = DS_PENDING               /* attempts left */
        :: row > 0 -> dstat[row] = DS_DEAD                  /* attempts exhausted */
        fi;
        check()
    }
}

inline run_deadline(r) {
    atomic {
        /* @op sweep.run_deadline @event RUN_TIMED_OUT */
        SWEEP_FENCE(r) && (rstat == CREATED || rstat == EXTRACTING) && inflight == 0 ->
        leader_wrote(r); time_out_run(); check()
    }
}

inline publish_stale(r) {
    atomic {
        /* @op sweep.publish_stale @event PUBLISH_UNKNOWN */
        SWEEP_FENCE(r) && rstat == PUBLISHING -> leader_wrote(r); rstat = PUBLISH_UNKNOWN; check()
    }
}

/* Everything a replica does: the dispatcher (VALIDATE_RUN step by step, REISSUE_PARTITION rows in
   one step), the sweeper's rules, acquiring leadership, dying. */
#if P > 1
#define PER_PARTITION_1(r) :: stale_partition(r, 1) :: send_reissue(r, 1) :: unacked(r, 2)
#else
#define PER_PARTITION_1(r)
#endif
#if P > 2
#define PER_PARTITION_2(r) :: stale_partition(r, 2) :: send_reissue(r, 2) :: unacked(r, 3)
#else
#define PER_PARTITION_2(r)
#endif
#define REPLICA(r) :: lease(r) :: send(r) :: record_outcome(r) :: crash(r) :: acquire(r) \
    :: run_deadline(r) :: publish_stale(r) :: unacked(r, 0) \
    :: stale_partition(r, 0) :: send_reissue(r, 0) :: unacked(r, 1) \
    PER_PARTITION_1(r) PER_PARTITION_2(r)

/* ---------------------------------------------------------------- PG-40 stage validation (§4.10, §4.11) */

/* The flow that a validation start answered started=true runs: it (re)creates the stage table,
   loads the extract into it, and validates it; the STAGING metrics pass only for one complete
   load. Only a start's own flow exists, so without a second start nothing else touches the table. */
inline pg40(k) {
    if
    :: atomic {
        /* @env PG-40 (re)creates the stage table */
        fl[k] == FL_STARTED && !TERMINAL(rstat) -> stage = 0; fl[k] = FL_PREPARED; check() }
    :: atomic {
        /* @env PG-40 loads the extract into the stage table */
        fl[k] == FL_PREPARED && !TERMINAL(rstat) ->
        if :: stage < 2 -> stage++ :: else fi; fl[k] = FL_LOADED; check() }
    :: atomic {
        /* @op stage_validated @event STAGE_VALIDATED */
        fl[k] == FL_LOADED && rstat == STAGE_VALIDATING && stage == 1 ->
        rstat = STAGING_VALIDATED; fl[k] = FL_DONE; check() }        /* STAGING metrics pass */
    fi
}

/* ---------------------------------------------------------------- PG-60 publish (§4.12, §4.13) */

/* Claim with token k: the CAS from STAGING_VALIDATED lets exactly one token in. Same-token replays
   answer claimed=true and change nothing; every other token is answered claimed=false. */
#ifdef MUTANT_NO_PUBLISH_CAS
#define CLAIMABLE(k) (rstat == STAGING_VALIDATED || (rstat == PUBLISHING && pub_token != k))
#else
#define CLAIMABLE(k) (rstat == STAGING_VALIDATED)
#endif
inline claim_publish(k) {
    atomic {
        /* @op claim_publish @event PUBLISH_STARTED */
        CLAIMABLE(k) && !(g_pub_claims & (1 << (k - 1))) ->
        rstat = PUBLISHING; pub_token = k;
        g_pub_claims = g_pub_claims | (1 << (k - 1));
        check()
    }
}

/* PG-60 k, answered claimed=true, runs its INSERT OVERWRITE once and learns how it went. */
inline overwrite(k) {
    atomic {
        /* @env PG-60 runs the INSERT OVERWRITE it was granted */
        (g_pub_claims & (1 << (k - 1))) && claimant_seen[k] == OW_NONE ->
        g_overwrites++; g_bad_stage = g_bad_stage || stage != 1;   /* it copies the stage table */
        if
        :: g_landed = 1; claimant_seen[k] = OW_PUBLISHED
        :: claimant_seen[k] = OW_FAILED
        :: g_landed = 1; claimant_seen[k] = OW_CUT_OFF        /* cut off after the data landed */
        :: claimant_seen[k] = OW_CUT_OFF                      /* cut off before */
        fi;
        check()
    }
}

/* The result report of claimant k: what its overwrite told it; a claimant that was refused and
   ran nothing may still report FAILED_PUBLISH from its failure path (PG-90). Only the stored
   publish token passes (409 PUBLISH_TOKEN_MISMATCH otherwise). */
#ifdef MUTANT_NO_PUBLISH_TOKEN_CHECK
#define REPORTER(k) true
#else
#define REPORTER(k) (pub_token == k)
#endif
inline publish_result(k) {
    atomic {
        /* @op publish_result @event PUBLISH_FINISHED @event RUN_FAILED @event PUBLISH_UNKNOWN */
        rstat == PUBLISHING && REPORTER(k) && (claimant_seen[k] != OW_NONE || !(g_pub_claims & (1 << (k - 1)))) ->
        if
        :: claimant_seen[k] == OW_PUBLISHED ->
            g_false_outcome = g_false_outcome || !g_landed; rstat = PUBLISHED
        :: claimant_seen[k] == OW_FAILED || claimant_seen[k] == OW_NONE ->
            g_false_outcome = g_false_outcome || g_landed; end_run(FAILED_PUBLISH)
        :: claimant_seen[k] == OW_CUT_OFF -> rstat = PUBLISH_UNKNOWN
        fi;
        check()
    }
}

/* ---------------------------------------------------------------- operators (§4.15–§4.17) */

inline resend(row) {
    atomic {
        /* @op resend_dispatch @event DISPATCH_RESENT */
        resends < RESENDS && (dstat[row] == DS_DEAD || dstat[row] == DS_SENT) ->
        resends++; dstat[row] = DS_PENDING;
        if :: row == 0 -> datt = 0; dlease = 0; dlease_epoch = 0 :: else fi;
        g_rearmed[row] = TERMINAL(rstat);
        check()
    }
}

/* ---------------------------------------------------------------- the world */
active proctype world() {
    atomic {
        /* @op create_run @event RUN_STARTED */
        rstat = CREATED;
        if :: mode_reissue = 1 :: mode_reissue = 0 fi;
        g_prev = rstat
    };
    do
    /* ---- PG-10: the manifest (§4.2, §5.2); replays change nothing */
    :: atomic {
        /* @op register_manifest @event MANIFEST_CREATED @event EXTRACT_VALIDATED */
        rstat == CREATED ->
        rstat = EXTRACTING;
        for (h_i : 0 .. P - 1) {
            if
            :: pzero[h_i] = 0; part[h_i] = PT_PENDING; source++
            :: pzero[h_i] = 1; part[h_i] = PT_SUCCESS; success_count++; g_succeeded[h_i] = 1
            fi
        }
        if
        :: success_count == P -> completion_cas()  /* CREATED→EXTRACTING→EXTRACTED_VALIDATED */
        :: else
        fi;
        check()
    }
    :: atomic {
        /* @op register_manifest @event MANIFEST_INVALID */
        rstat == CREATED -> end_run(FAILED_MANIFEST); check()
    }

    /* ---- PG-20 workers, any request with any token */
    WORKER_REQUESTS(0)
#if P > 1
    WORKER_REQUESTS(1)
#endif
#if P > 2
    WORKER_REQUESTS(2)
#endif

    /* ---- NiFi's stage failures: /fail with the five allowed pairs (§4.3); others are 409 */
    :: atomic {
        /* @op fail_run @event RUN_FAILED */
        FAILABLE(rstat) && inflight == 0 ->
        if
        :: rstat == CREATED -> end_run(FAILED_MANIFEST)
        :: rstat == EXTRACTING -> g_ended_extract = 1; end_run(FAILED_EXTRACT)
        :: rstat == STAGE_VALIDATING -> end_run(FAILED_STAGE_VALIDATION)
        :: rstat == STAGING_VALIDATED -> end_run(FAILED_PUBLISH)
        :: rstat == PUBLISHED -> end_run(FAILED_TARGET_VALIDATION)
        fi;
        check()
    }

    /* ---- dispatcher and sweeper replicas, leadership */
    REPLICA(0)
#if D > 1
    REPLICA(1)
#endif
#if D > 2
    REPLICA(2)
#endif
    :: lease_expires()

    /* ---- PG-05 (§4.9): a start with the dispatch id NiFi received; the ACK commits in every case */
    :: atomic {
        /* @op start_validation @event STAGE_VALIDATION_STARTED */
        delivered && (dstat[0] != DS_ACKED || rstat == EXTRACTED_VALIDATED || MUTANT_START_AGAIN) ->
        dstat[0] = DS_ACKED; g_acked = 1;
        if
        :: rstat == EXTRACTED_VALIDATED || MUTANT_START_AGAIN ->
            rstat = STAGE_VALIDATING; fl[g_starts] = FL_STARTED; g_starts++
        :: else                                             /* started=false */
        fi;
        check()
    }
    :: pg40(0)
#ifdef MUTANT_NO_START_CAS
    :: pg40(1)
#endif

    /* ---- PG-60: two instances, each with its own publish token */
    :: claim_publish(1)
    :: claim_publish(2)
    :: overwrite(1)
    :: overwrite(2)
    :: publish_result(1)
    :: publish_result(2)
    :: atomic {
        /* @op succeed @event RUN_SUCCESS */
        rstat == PUBLISHED -> end_run(SUCCESS); check()      /* TARGET metrics pass */
    }

    /* ---- operators */
    :: atomic {
        /* @op resolve_publish_unknown @event PUBLISH_UNKNOWN_RESOLVED */
        rstat == PUBLISH_UNKNOWN ->
        g_resolutions++; g_resolving = 1;
        if
        :: rstat = PUBLISHED
        :: end_run(FAILED_PUBLISH)
        fi;
        check()
    }
    :: atomic {
        /* @op cancel_run @event RUN_CANCELLED */
        CANCELLABLE(rstat) && inflight == 0 -> end_run(CANCELLED); check()
    }
    :: resend(0)
    :: resend(1)
#if P > 1
    :: resend(2)
#endif
#if P > 2
    :: resend(3)
#endif

    /* ---- another run of the same key (§4.1): uq_load_run_active refuses it while one is active */
    :: atomic {
        /* @op create_run @event RUN_STARTED */
        run2 == R_NONE && !ACTIVE(rstat) -> run2 = CREATED; check()
    }

    /* ---- nothing can move any more: the run has ended, or it waits for a person and says so
       (a DEAD dispatch raises NeedsOperator), never silently */
    :: timeout ->
        assert(TERMINAL(rstat) || (rstat == EXTRACTED_VALIDATED && dstat[0] == DS_DEAD)); /* @property never-stuck-silently */
        break
    od
}
