/* Generated from ledger/src/machine.rs (RUN_TRANSITIONS): do not edit. Regenerate with
   LC_REGENERATE=1 cargo test -p load-control-ledger --test run_machine; that test fails
   while this file is stale. */
#define RUN_TRANSITION(a, b) ( \
    ((a) == CREATED && (b) == EXTRACTING) || \
    ((a) == CREATED && (b) == FAILED_MANIFEST) || \
    ((a) == CREATED && (b) == TIMED_OUT) || \
    ((a) == EXTRACTING && (b) == TIMED_OUT) || \
    ((a) == EXTRACTING && (b) == EXTRACTED_VALIDATED) || \
    ((a) == EXTRACTING && (b) == FAILED_EXTRACT) || \
    ((a) == EXTRACTING && (b) == FAILED_SNAPSHOT_EXPIRED) || \
    ((a) == EXTRACTED_VALIDATED && (b) == STAGE_VALIDATING) || \
    ((a) == STAGE_VALIDATING && (b) == STAGING_VALIDATED) || \
    ((a) == STAGE_VALIDATING && (b) == FAILED_STAGE_VALIDATION) || \
    ((a) == STAGING_VALIDATED && (b) == PUBLISHING) || \
    ((a) == STAGING_VALIDATED && (b) == FAILED_PUBLISH) || \
    ((a) == PUBLISHING && (b) == PUBLISHED) || \
    ((a) == PUBLISHING && (b) == FAILED_PUBLISH) || \
    ((a) == PUBLISHING && (b) == PUBLISH_UNKNOWN) || \
    ((a) == PUBLISH_UNKNOWN && (b) == PUBLISHED) || \
    ((a) == PUBLISH_UNKNOWN && (b) == FAILED_PUBLISH) || \
    ((a) == PUBLISHED && (b) == SUCCESS) || \
    ((a) == PUBLISHED && (b) == FAILED_TARGET_VALIDATION) || \
    ((a) == CREATED && (b) == CANCELLED) || \
    ((a) == EXTRACTING && (b) == CANCELLED) || \
    ((a) == EXTRACTED_VALIDATED && (b) == CANCELLED) || \
    ((a) == STAGE_VALIDATING && (b) == CANCELLED) || \
    ((a) == STAGING_VALIDATED && (b) == CANCELLED) || \
    ((a) == CREATED && (b) == PUBLISH_UNKNOWN) || \
    ((a) == EXTRACTING && (b) == PUBLISH_UNKNOWN) || \
    ((a) == EXTRACTED_VALIDATED && (b) == PUBLISH_UNKNOWN) || \
    ((a) == STAGE_VALIDATING && (b) == PUBLISH_UNKNOWN) || \
    ((a) == STAGING_VALIDATED && (b) == PUBLISH_UNKNOWN))
