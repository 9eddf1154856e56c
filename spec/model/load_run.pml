/*
 * The run protocol of load-control, for the spin model checker.
 *
 * What is modelled: one run and every ledger decision that moves it (CONTRACT §2, §4, §5, §6, §7),
 * the NiFi flows, workers, dispatcher replicas, sweeper and operators that ask for those decisions.
 * docs/model.md explains the abstraction, the bounds and how to run it (scripts/model-check).
 *
 * One `atomic` block = one ledger transaction. The ledger's locking (§3.10, §5.3) makes committed
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
 * operation, an event or a status that the model lacks.
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
#define ACTIVE(s) ((s) >= CREATED && (s) <= PUBLISH_UNKNOWN)
#define TERMINAL(s) ((s) >= SUCCESS)
#define FAILABLE(s) ((s) == CREATED || (s) == EXTRACTING || (s) == STAGE_VALIDATING || (s) == STAGING_VALIDATED || (s) == PUBLISHED)
#define CANCELLABLE(s) ((s) >= CREATED && (s) <= STAGING_VALIDATED)

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

/* ---------------------------------------------------------------- the ledger */
byte rstat;                 /* load_run.status */
byte run2;                  /* a second run of the same (jobKey, businessKey): R_NONE or CREATED */
byte success_count;         /* load_run.success_partition_count */
byte extracted;             /* load_run.extracted_count (rows in units: 1 per non-empty partition) */
byte source;                /* load_run.source_count */
byte part[P];               /* load_partition.status */
byte ptoken[P];             /* load_partition.claim_token (0 = NULL) */
byte pattempt[P];           /* load_partition.attempt_count */
bit pzero[P];               /* expectedRowCount = 0 */
byte dstat[ROWS];           /* load_dispatch.status */
/* The VALIDATE_RUN row goes through the dispatcher step by step (lease, send, outcome). The
   REISSUE_PARTITION rows take the same code path; the model sends them in one abstract step, so
   that their attempts and leases do not multiply the state space. */
byte datt;                  /* load_dispatch.attempt_count of VALIDATE_RUN */
byte dlease;                /* 0, or r + 1 while replica r holds an unexpired lease on it */
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

/* ---------------------------------------------------------------- ghosts (for the properties) */
byte g_completions;         /* completion CAS wins = responses with validationScheduled=true */
byte g_vr_inserts;          /* VALIDATE_RUN rows inserted */
byte g_starts;              /* validation/start answered started=true */
byte g_pub_claims;          /* bitmask of publish tokens answered claimed=true */
byte g_resolutions;         /* resolves answered changed=true */
bit g_succeeded[P];         /* the partition has been SUCCESS */
bit g_ended_extract;        /* the run entered FAILED_EXTRACT or FAILED_SNAPSHOT_EXPIRED */
bit g_rearmed[ROWS];        /* an operator resent the row after the run ended (§4.15 allows it) */
byte g_prev;                /* run status after the previous transaction */
bit g_resolving;            /* the transaction running is an operator's resolve */

hidden byte h_i, h_n, h_rows;

/* ---------------------------------------------------------------- shared steps */

#ifdef MUTANT_NO_ABORT
#define MUTANT_KEEP_PARTITIONS && false
#else
#define MUTANT_KEEP_PARTITIONS
#endif

/* §2.2: entering a terminal status other than SUCCESS and TIMED_OUT aborts unfinished partitions;
   entering any terminal status settles PENDING and SENT dispatches as DEAD. */
inline end_run(to) {
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

inline count_successes() {
    h_n = 0;
    h_rows = 0;
    for (h_i : 0 .. P - 1) {
        if
        :: part[h_i] == PT_SUCCESS -> h_n++; h_rows = h_rows + 1 - pzero[h_i]
        :: else
        fi
    }
}

/* §5.4: the conditional increment made the count reach expected: one recount CAS. */
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

/* A leader transaction starts with the fence (§7.1): a stale epoch writes nothing. The sweeper
   runs in the current leader; a deposed one's ticks are fenced out and change nothing. */
#ifndef MUTANT_NO_FENCE
#define FENCED(r) (rep_epoch[r] != 0 && rep_epoch[r] == epoch)
#else
#define FENCED(r) (rep_epoch[r] != 0)
#endif
#define LEADER (epoch > 0)

#ifdef MUTANT_NO_START_CAS
#define MUTANT_START_AGAIN (rstat == STAGE_VALIDATING)
#else
#define MUTANT_START_AGAIN false
#endif

/* ---------------------------------------------------------------- the §11 guarantees */
inline check() {
    /* 1, 2: at most one active run per key; PUBLISH_UNKNOWN counts as active */
    assert(!(run2 == CREATED && ACTIVE(rstat)));
    /* 13: terminal runs are never revived */
    assert(!TERMINAL(g_prev) || rstat == g_prev);
    /* 11: only an operator's resolve leaves PUBLISH_UNKNOWN */
    assert(!(g_prev == PUBLISH_UNKNOWN && rstat != PUBLISH_UNKNOWN) || g_resolving);
    /* 6, 7: exactly one completion decision and one VALIDATE_RUN row */
    assert(g_completions <= 1 && g_vr_inserts <= 1);
    assert(rstat <= EXTRACTING || rstat == FAILED_MANIFEST || rstat == FAILED_EXTRACT
           || rstat == FAILED_SNAPSHOT_EXPIRED || rstat == TIMED_OUT || rstat == CANCELLED
           || g_completions == 1);
    /* 8: completion and extract failure never both happen */
    assert(!(g_ended_extract && g_completions > 0));
    assert(!g_ended_extract || dstat[0] == DS_NONE);
    /* 9: one validation start; 10: one publish claimant; 12: one resolution */
    assert(g_starts <= 1);
    assert(g_pub_claims <= 2 && g_pub_claims != 3);
    assert(g_resolutions <= 1);
    /* 16: counters agree with the partition rows; extracted_count is 0 until the completion */
    count_successes();
    assert(rstat == CREATED || rstat == FAILED_MANIFEST || success_count == h_n);
    assert((g_completions == 0 && extracted == 0)
           || (g_completions == 1 && extracted == source && h_rows == source));
    for (h_i : 0 .. P - 1) {
        /* 14, 15: a terminal run leaves no unfinished partition */
        assert(!TERMINAL(rstat) || !UNFINISHED(part[h_i]));
        /* 5: a succeeded partition never changes */
        assert(!g_succeeded[h_i] || part[h_i] == PT_SUCCESS);
        /* 3: a RUNNING partition has exactly one owner token, a RETRY partition none */
        assert(part[h_i] != PT_RUNNING || (ptoken[h_i] != 0 && rstat == EXTRACTING));
        assert(part[h_i] != PT_RETRY || ptoken[h_i] == 0)
    }
    for (h_i : 0 .. ROWS - 1) {
        /* 14: ... and no PENDING or SENT dispatch, unless an operator resent one since */
        assert(!TERMINAL(rstat) || (dstat[h_i] != DS_PENDING && dstat[h_i] != DS_SENT) || g_rearmed[h_i]);
    }
    /* 18: VALIDATE_RUN is SENT only when PG-05 has it */
    assert(dstat[0] != DS_SENT || delivered);
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

/* §4.7 a chunk report (chunkCount = 1) from token t. Reports with any other token are 409
   CLAIM_MISMATCH and change nothing, as do identical replays to a SUCCESS partition (changed ones
   are 409 CHUNK_CONFLICT, rolled back) and late reports after the run ended (recorded only). */
inline report_chunk(p, t) {
    atomic {
        /* @op report_chunk @event PARTITION_SUCCESS @event EXTRACT_VALIDATED @event PARTITION_FAILED @event RUN_FAILED */
        part[p] == PT_RUNNING && ptoken[p] == t ->
        if
        :: part[p] = PT_SUCCESS; g_succeeded[p] = 1;         /* the gate passes */
           success_count++;                                    /* WHERE status = 'EXTRACTING' */
           if
           :: success_count == P -> completion_cas()
           :: else
           fi
        :: part[p] = PT_FAILED; g_ended_extract = 1;         /* mismatch: re-run FOR UPDATE */
           end_run(FAILED_EXTRACT)
        fi;
        check()
    }
}

/* §4.8 the final failure of the claim held by token t. */
inline fail_partition(p, t) {
    atomic {
        /* @op fail_partition @event PARTITION_FAILED @event RUN_FAILED */
        part[p] == PT_RUNNING && ptoken[p] == t ->
        part[p] = PT_FAILED;
        g_ended_extract = 1;
        if
        :: end_run(FAILED_EXTRACT)
        :: end_run(FAILED_SNAPSHOT_EXPIRED)                   /* ORA-01555, ORA-08180, SNAPSHOT */
        fi;
        check()
    }
}

/* Every request of a worker, as options of the world's loop. */
#define WORKER_TOKEN(p, t) :: claim_again(p, t) :: report_chunk(p, t) :: fail_partition(p, t)
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
#define WORKER_REQUESTS(p) :: claim_new(p) WORKER_TOKEN(p, 1) WORKER_TOKEN(p, 2) WORKER_TOKEN_3(p) WORKER_TOKEN_4(p)

/* ---------------------------------------------------------------- dispatcher replicas (§6) */

inline lease(r) {
    atomic {
        /* @op lease_dispatches */
        FENCED(r) && !rep_row[r] && dstat[0] == DS_PENDING && dlease == 0 ->
        datt++; dlease = r + 1; rep_row[r] = 1; rep_send[r] = SEND_NONE;
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
        :: FENCED(r) && dstat[0] == DS_PENDING ->           /* conditional: an early ACK stays */
            assert(rep_epoch[r] == epoch);                  /* 19: a deposed leader writes nothing */
            if
            :: rep_send[r] == SEND_2XX -> dstat[0] = DS_SENT
            :: rep_send[r] == SEND_RETRYABLE && datt >= DISPATCH_MAX -> dstat[0] = DS_DEAD
            :: rep_send[r] == SEND_RETRYABLE && datt < DISPATCH_MAX -> skip   /* backoff */
            :: rep_send[r] == SEND_REFUSED -> dstat[0] = DS_DEAD
            fi;
            dlease = 0
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
        epoch < EPOCHS && !FENCED(r) -> epoch++; rep_epoch[r] = epoch; check()
    }
}

#define REPLICA(r) :: lease(r) :: send(r) :: record_outcome(r) :: crash(r) :: acquire(r)

/* dispatch.lease passes. A live sender sends and records within its lease (HTTP timeout <
   dispatch.lease), so only the lease of a sender that died or finished expires. */
inline lease_expires() {
    atomic {
        /* @env dispatch.lease passes */
        dlease != 0 && !rep_row[dlease - 1] -> dlease = 0; check() }
}

/* A REISSUE_PARTITION row, leased, sent and recorded in one step by the current leader. */
inline send_reissue(p) {
    atomic {
        /* @op lease_dispatches @op dispatch_request @op record_dispatch_outcome @event DISPATCH_DEAD */
        LEADER && dstat[1 + p] == DS_PENDING ->
        if
        :: dstat[1 + p] = DS_SENT                           /* PG-20 answered 2xx */
        :: dstat[1 + p] = DS_DEAD                           /* refused, or attempts exhausted */
        fi;
        check()
    }
}

/* ---------------------------------------------------------------- the sweeper (§7.2) */

inline stale_partition(p) {
    atomic {
        /* @op sweep.stale_partitions @event RECOVERY_REISSUED @event RUN_TIMED_OUT */
        LEADER && rstat == EXTRACTING && part[p] == PT_RUNNING ->
        if
        :: mode_reissue && pattempt[p] < MAX_ATTEMPTS ->
            /* 17: one reissue per claim (the reset clears the token, only a new claim sets one);
               the claim ACKed the previous reissue's row */
            assert(ptoken[p] != 0 && (dstat[1 + p] == DS_NONE || dstat[1 + p] == DS_ACKED));
            part[p] = PT_RETRY; ptoken[p] = 0;
            dstat[1 + p] = DS_PENDING
        :: else -> time_out_run()                           /* FAIL mode, or attempts exhausted */
        fi;
        check()
    }
}

inline unacked(row) {
    atomic {
        /* @op sweep.unacked_dispatches @event DISPATCH_REQUEUED @event DISPATCH_DEAD */
        LEADER && dstat[row] == DS_SENT && AWAITED(row) ->
        if
        :: row == 0 && datt < DISPATCH_MAX -> dstat[0] = DS_PENDING; dlease = 0
        :: row == 0 && datt >= DISPATCH_MAX -> dstat[0] = DS_DEAD
        :: row > 0 -> dstat[row] = DS_PENDING               /* attempts left */
        :: row > 0 -> dstat[row] = DS_DEAD                  /* attempts exhausted */
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
        if :: row == 0 -> datt = 0; dlease = 0 :: else fi;
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
    WORKER_REQUESTS(1)
#if P > 2
    WORKER_REQUESTS(2)
#endif

    /* ---- NiFi's stage failures: /fail with the five allowed pairs (§4.3); others are 409 */
    :: atomic {
        /* @op fail_run @event RUN_FAILED */
        FAILABLE(rstat) ->
        if
        :: rstat == CREATED -> end_run(FAILED_MANIFEST)
        :: rstat == EXTRACTING -> g_ended_extract = 1; end_run(FAILED_EXTRACT)
        :: rstat == STAGE_VALIDATING -> end_run(FAILED_STAGE_VALIDATION)
        :: rstat == STAGING_VALIDATED -> end_run(FAILED_PUBLISH)
        :: rstat == PUBLISHED -> end_run(FAILED_TARGET_VALIDATION)
        fi;
        check()
    }

    /* ---- dispatcher replicas and leadership */
    REPLICA(0)
    REPLICA(1)
#if D > 2
    REPLICA(2)
#endif
    :: lease_expires()
    :: send_reissue(0)
    :: send_reissue(1)
#if P > 2
    :: send_reissue(2)
#endif

    /* ---- PG-05 (§4.9): a start with the dispatch id NiFi received; the ACK commits in every case */
    :: atomic {
        /* @op start_validation @event STAGE_VALIDATION_STARTED */
        delivered && (dstat[0] != DS_ACKED || rstat == EXTRACTED_VALIDATED || MUTANT_START_AGAIN) ->
        dstat[0] = DS_ACKED;
        if
        :: rstat == EXTRACTED_VALIDATED || MUTANT_START_AGAIN -> rstat = STAGE_VALIDATING; g_starts++
        :: else                                             /* started=false */
        fi;
        check()
    }
    :: atomic {
        /* @op stage_validated @event STAGE_VALIDATED */
        rstat == STAGE_VALIDATING -> rstat = STAGING_VALIDATED; check()  /* STAGING metrics pass */
    }

    /* ---- PG-60 publish (§4.12, §4.13): two instances with their own tokens */
    :: atomic {
        /* @op claim_publish @event PUBLISH_STARTED */
        rstat == STAGING_VALIDATED ->
        rstat = PUBLISHING;
        if
        :: pub_token = 1
        :: pub_token = 2
        fi;
        g_pub_claims = g_pub_claims | (1 << (pub_token - 1));
        check()
    }
    :: atomic {
        /* @op publish_result @event PUBLISH_FINISHED @event RUN_FAILED @event PUBLISH_UNKNOWN */
        rstat == PUBLISHING ->      /* only pub_token's report passes the token check (409 else) */
        assert(g_pub_claims == (1 << (pub_token - 1)));      /* 10: only the claimant reports */
        if
        :: rstat = PUBLISHED
        :: end_run(FAILED_PUBLISH)
        :: rstat = PUBLISH_UNKNOWN                           /* the publish was cut off */
        fi;
        check()
    }
    :: atomic {
        /* @op succeed @event RUN_SUCCESS */
        rstat == PUBLISHED -> end_run(SUCCESS); check()      /* TARGET metrics pass */
    }

    /* ---- the sweeper, in the leader */
    :: stale_partition(0)
    :: stale_partition(1)
#if P > 2
    :: stale_partition(2)
#endif
    :: atomic {
        /* @op sweep.run_deadline @event RUN_TIMED_OUT */
        LEADER && (rstat == CREATED || rstat == EXTRACTING) -> time_out_run(); check()
    }
    :: unacked(0)
    :: unacked(1)
    :: unacked(2)
#if P > 2
    :: unacked(3)
#endif
    :: atomic {
        /* @op sweep.publish_stale @event PUBLISH_UNKNOWN */
        LEADER && rstat == PUBLISHING -> rstat = PUBLISH_UNKNOWN; check()
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
        CANCELLABLE(rstat) -> end_run(CANCELLED); check()
    }
    :: resend(0)
    :: resend(1)
    :: resend(2)
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
        assert(TERMINAL(rstat) || (rstat == EXTRACTED_VALIDATED && dstat[0] == DS_DEAD));
        break
    od
}
