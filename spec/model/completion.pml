/*
 * The completion of a run's extraction without a queue on the run row (issue 30 item 3), for the
 * spin model checker, at the level of SQL statements under PostgreSQL's READ COMMITTED.
 *
 * spec/model/load_run.pml checks the run protocol with one atomic step per transaction. This model
 * checks what that abstraction assumes for the completion: that the statements of concurrent
 * partition successes, with their row locks, snapshots and SKIP LOCKED, decide the completion as
 * serialized transactions would. docs/model.md explains it; scripts/model-check runs it.
 *
 * A partition success (a chunk report whose gate passes: the server-side function
 * `nifi_ops.report_chunk_v2` (ledger/functions/report_chunk_v2.sql), one statement on the wire; every step below
 * is a statement of its own inside it, or inside the functions it calls, each with a snapshot of
 * its own):
 *   1. takes the run's shared advisory lock and the run row FOR KEY SHARE (every run-ending
 *      operation takes the exclusive advisory lock and FOR UPDATE: they exclude each other);
 *   2. takes its partition row FOR UPDATE (waits for every other lock on the row, pins included);
 *   3. reads the run's status (a fresh snapshot after those waits); a run that is not EXTRACTING,
 *      or a partition that is not RUNNING, is recorded only;
 *   4. writes its partition SUCCESS (visible to its own statements only, until it commits);
 *   5. pins one unfinished sibling partition: `SELECT … FOR KEY SHARE SKIP LOCKED LIMIT 1`, which
 *      skips a row another transaction holds FOR UPDATE (a sibling's report, success or not) and
 *      re-checks a row updated since the statement's snapshot on its newest version. A pinned
 *      sibling cannot be decided before this transaction commits (its report takes it FOR UPDATE,
 *      and waits), so its success will see this one. Found one: commit, without the run row;
 *   6. found none: it may be the last. It takes the run row's write lock (`SELECT … FOR NO KEY
 *      UPDATE`), which waits for another possibly-last success holding it;
 *   7. recounts in a statement of its own, whose snapshot is taken after that wait: every success
 *      that committed before it is seen. All SUCCESS (its own included): the completion CAS
 *      (`… WHERE status = 'EXTRACTING'`);
 *   8. commits: its locks go.
 * Two last successes cannot miss each other: each holds its partition FOR UPDATE from step 2, so
 * neither can pin the other (step 5 skips it) and both reach step 6; the second to get the run row
 * recounts after the first has committed.
 *
 * A run-ending operation (cancel, run /fail, a partition's /fail, a gate mismatch's re-run, the
 * sweeper's timeouts) takes the exclusive advisory lock and the run row FOR UPDATE, so it waits
 * for every success in flight and no success starts while it decides. It ends an EXTRACTING run
 * (unfinished partitions ABORTED) or cancels an EXTRACTED_VALIDATED one.
 *
 * `success_partition_count` is not written by the successes. It is read as the count of SUCCESS
 * partitions while the run is EXTRACTING, and stored (from a recount) by the completion CAS and by
 * every transition that leaves EXTRACTING; afterwards no partition can become SUCCESS.
 *
 * Mixed releases (OLD=1: each report runs, nondeterministically, this release's protocol or release
 * 0.1.0's, as during a rolling upgrade or after a rollback). A 0.1.0 success does steps 1 to 4 as
 * above (it holds its partition FOR UPDATE from step 2, so pins skip it and it waits for pins of
 * its row), then:
 *   5o. `UPDATE load_run SET success_partition_count = success_partition_count + 1 … WHERE status =
 *       'EXTRACTING' RETURNING success_partition_count, expected_partition_count`: the statement's
 *       snapshot is taken, then it waits for the run row's write lock (held by another 0.1.0
 *       increment or this release's `FOR NO KEY UPDATE`). Once it holds it, the BEFORE UPDATE
 *       trigger of migration 20261203000010 replaces the new value by the count of SUCCESS
 *       partitions, read by a VOLATILE function: a snapshot of its own, after the wait (its own
 *       SUCCESS included);
 *   6o. returned count = expected: the completion CAS (a recount in a statement of its own, as 7);
 *   7o. commits: the stored count, the completion, the release of every lock.
 * Without the trigger the increment returns the stored count + 1, which lags once this release's
 * successes stop writing it (MUTANT_NO_TRIGGER); a STABLE trigger function counts from the
 * update's snapshot, taken before the wait (MUTANT_TRIGGER_STABLE).
 *
 * Each MUTANT_* removes a part of the protocol; scripts/model-check checks that spin catches it.
 */

#ifndef N
#define N 3             /* partitions of the run, each with one report that passes the gate */
#endif
#ifndef PROGRESS
#define PROGRESS 1      /* progress reports per partition before its success (hold the row, decide nothing) */
#endif
#ifndef ENDER
#define ENDER 1         /* a concurrent run-ending operation (cancel or fail) */
#endif
/* COMPAT(model-old-release, 0.3.0): goes with the recount trigger it checks. */
#ifndef OLD
#define OLD 0           /* 1: each report may run release 0.1.0's success instead (mixed releases) */
#endif

#define EXTRACTING 2
#define EXTRACTED_VALIDATED 3
#define FAILED_EXTRACT 11
#define CANCELLED 17

#define PT_RUNNING 2
#define PT_SUCCESS 4
#define PT_ABORTED 7

/* ---------------------------------------------------------------- committed rows */
byte rstat = EXTRACTING;    /* load_run.status */
byte stored;                /* load_run.success_partition_count as stored */
byte part[N];               /* load_partition.status, committed */

/* ---------------------------------------------------------------- locks */
byte nshared;               /* holders of the run's shared advisory lock (and FOR KEY SHARE) */
bit excl;                   /* the exclusive advisory lock (and FOR UPDATE) is held */
byte pfu[N];                /* the partition row FOR UPDATE: 0, or reporter p + 1 */
byte pks[N];                /* the partition row FOR KEY SHARE: bitmask of the reporters pinning it */
byte rrow;                  /* the run row's write lock (FOR NO KEY UPDATE): 0, or reporter p + 1 */
byte open;                  /* successes that wrote SUCCESS and have not committed */

/* ---------------------------------------------------------------- ghosts */
byte g_completions;         /* completion CAS wins that committed */
bit g_ended;                /* a run-ending operation won */
byte g_done;                /* reporters that finished */

hidden byte h_i, h_n;

/* Committed SUCCESS partitions. */
inline count_committed() {
    h_n = 0;
    for (h_i : 0 .. N - 1) {
        if
        :: part[h_i] == PT_SUCCESS -> h_n++
        :: else
        fi
    }
}

inline check() {
    count_committed();
    /* exactly once: at most one completion commits ... */
    assert(g_completions <= 1);                                         /* @property completion-at-most-once */
    /* ... and at least one: no run is left EXTRACTING with every partition's success committed */
    assert(!(rstat == EXTRACTING && open == 0 && h_n == N));            /* @property completion-at-least-once */
    /* the count as read (computed while EXTRACTING, stored afterwards) is the SUCCESS rows' */
    assert(rstat == EXTRACTING || stored == h_n);                       /* @property count-exact */
}

/* The report of partition p, statement by statement. */
proctype reporter(byte p) {
    byte me = p + 1;
    byte k, q, snap, progress = PROGRESS, mine;
    bit pinned, completes, old;
#if OLD
    /* the release that serves this report (the progress reports too: they change nothing here) */
    if
    :: old = 1
    :: old = 0
    fi;
#endif
again:
    /* 1. pg_advisory_xact_lock_shared, run row FOR KEY SHARE */
    atomic { !excl -> nshared++ };
    /* 2. the partition row FOR UPDATE: waits for its reports and for the successes pinning it */
    atomic { pfu[p] == 0 && pks[p] == 0 -> pfu[p] = me };
    /* 3., 4. the chunk statement reads the run's status; the gate passes: SUCCESS (own write) */
    atomic {
        if
        :: rstat != EXTRACTING || part[p] != PT_RUNNING ->  /* recorded only */
            pfu[p] = 0; nshared--; goto finished
        :: rstat == EXTRACTING && part[p] == PT_RUNNING && progress > 0 ->
            progress--; pfu[p] = 0; nshared--; goto again   /* a progress report: commits */
        :: rstat == EXTRACTING && part[p] == PT_RUNNING -> open++
        fi
    };
    if
    :: old -> goto oldsuccess
    :: else
    fi;
    /* 5. the pin: the first unfinished sibling after p (wrapping) not held FOR UPDATE by another
       transaction. MUTANT_NO_PIN: a plain read, which sees every unfinished sibling, locked or not;
       MUTANT_PIN_WITHOUT_LOCK: SKIP LOCKED without the lock (the sibling's report may then start,
       and recount, before this success commits) */
    atomic {
        pinned = 0;
        for (k : 1 .. N - 1) {
            q = (p + k) % N;
            if
#ifdef MUTANT_NO_PIN
            :: !pinned && part[q] == PT_RUNNING -> pinned = 1
#elif defined(MUTANT_PIN_WITHOUT_LOCK)
            :: !pinned && part[q] == PT_RUNNING && pfu[q] == 0 -> pinned = 1
#else
            :: !pinned && part[q] == PT_RUNNING && pfu[q] == 0 -> pinned = 1; pks[q] = pks[q] | (1 << p)
#endif
            :: else
            fi
        }
    };
    if
    :: pinned -> goto commit
    :: else
    fi;
    /* 6. the run row's write lock: the statement's snapshot is taken first, then it waits */
    atomic {
        snap = 0;
        for (h_i : 0 .. N - 1) {
            if
            :: part[h_i] == PT_SUCCESS -> snap = snap | (1 << h_i)
            :: else
            fi
        }
    };
    atomic { rrow == 0 -> rrow = me };
    /* 7. the recount and the completion CAS: a fresh snapshot; in the mutant, the snapshot of the
       statement that waited (an `UPDATE … FROM (recount)` that locks and counts at once) */
    atomic {
        h_n = 1;                                            /* its own SUCCESS */
        for (h_i : 0 .. N - 1) {
            if
#ifdef MUTANT_STALE_RECOUNT
            :: h_i != p && (snap & (1 << h_i)) -> h_n++
#else
            :: h_i != p && part[h_i] == PT_SUCCESS -> h_n++
#endif
            :: else
            fi
        }
        completes = (rstat == EXTRACTING && h_n == N)
    };
    goto commit;
oldsuccess:
    /* 5o. release 0.1.0's increment: its snapshot first, then the wait for the run row */
    atomic {
        snap = 0;
        for (h_i : 0 .. N - 1) {
            if
            :: part[h_i] == PT_SUCCESS -> snap = snap | (1 << h_i)
            :: else
            fi
        }
    };
    atomic {
        rrow == 0 -> rrow = me;
        /* no run-ending operation runs beside the shared advisory lock, and no completion without
           this success: the WHERE status = 'EXTRACTING' holds (else 0.1.0 escalates) */
        assert(rstat == EXTRACTING);                                    /* @property completion-in-extracting */
#ifdef MUTANT_NO_TRIGGER
        mine = stored + 1
#else
        mine = 1;                                           /* its own SUCCESS */
        for (h_i : 0 .. N - 1) {
            if
#ifdef MUTANT_TRIGGER_STABLE
            :: h_i != p && (snap & (1 << h_i)) -> mine++
#else
            :: h_i != p && part[h_i] == PT_SUCCESS -> mine++
#endif
            :: else
            fi
        }
#endif
    };
    /* 6o. the returned count is the expected one: 0.1.0's completion CAS, a statement of its own */
    atomic {
        completes = 0;
        if
        :: mine == N ->
            h_n = 1;
            for (h_i : 0 .. N - 1) {
                if
                :: h_i != p && part[h_i] == PT_SUCCESS -> h_n++
                :: else
                fi
            }
            completes = (rstat == EXTRACTING && h_n == N)
        :: else
        fi
    };
commit:
    /* 8. commit: the partition's SUCCESS, the completion, and the release of every lock */
    atomic {
        part[p] = PT_SUCCESS;
        open--;
        if
        :: old && !completes -> stored = mine                  /* 0.1.0's increment, as the trigger set it */
        :: else
        fi;
        if
        :: completes ->
            /* never after a cancel or failure won, never while a partition is unfinished */
            assert(rstat == EXTRACTING && !g_ended);                    /* @property completion-in-extracting */
            count_committed();
            assert(h_n == N);                                           /* @property completion-all-succeeded */
            rstat = EXTRACTED_VALIDATED;
            stored = h_n;
            g_completions++
        :: else
        fi;
        pfu[p] = 0;
        for (h_i : 0 .. N - 1) {
            pks[h_i] = pks[h_i] & ~(1 << p)
        }
        if
        :: rrow == me -> rrow = 0
        :: else
        fi;
        nshared--;
        check()
    };
finished:
    atomic { g_done++ }
}

/* Cancel, run /fail, a partition /fail, a gate mismatch's re-run: exclusive advisory lock and run
   row FOR UPDATE, then the CAS, the stored count (a recount) and the ABORTED partitions. */
proctype ender() {
    atomic { !excl && nshared == 0 -> excl = 1 };
    atomic {
        if
        :: rstat == EXTRACTING ->
            g_ended = 1;
            count_committed();
            stored = h_n;
            for (h_i : 0 .. N - 1) {
                if
                :: part[h_i] == PT_RUNNING -> part[h_i] = PT_ABORTED
                :: else
                fi
            }
            if
            :: rstat = CANCELLED
            :: rstat = FAILED_EXTRACT
            fi
        :: rstat == EXTRACTED_VALIDATED -> rstat = CANCELLED     /* a cancel after the completion */
        :: else
        fi;
        excl = 0;
        check()
    }
}

init {
    atomic {
        for (h_i : 0 .. N - 1) {
            part[h_i] = PT_RUNNING
        }
        h_i = 0;
        do
        :: h_i < N -> run reporter(h_i); h_i++
        :: else -> break
        od;
#if ENDER
        run ender();
#endif
    };
    /* every process has finished: the final state */
    (_nr_pr == 1);
    count_committed();
    /* no final state is missed: all partitions succeeded and the run completed (or it ended) */
    assert(!(rstat == EXTRACTING && h_n == N));                         /* @property completion-at-least-once */
    assert(g_done == N)
}
