//! The run, partition and dispatch state sets of CONTRACT §2 and the transitions that need no
//! database to decide.
use serde::{Deserialize, Serialize};

macro_rules! string_enum {
    ($(#[$m:meta])* $name:ident { $($variant:ident = $text:literal),+ $(,)? }) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        pub enum $name { $(#[serde(rename = $text)] $variant),+ }
        // Written out because the derive does not see the serde renames made inside this macro:
        // the document listed the Rust variant names ("Created"), not the wire ones ("CREATED").
        #[cfg(feature = "openapi")]
        impl utoipa::PartialSchema for $name {
            fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
                utoipa::openapi::schema::ObjectBuilder::new()
                    .schema_type(utoipa::openapi::schema::Type::String)
                    .enum_values(Some($name::ALL.iter().map(|v| v.as_str())))
                    .into()
            }
        }
        #[cfg(feature = "openapi")]
        impl utoipa::ToSchema for $name {
            fn name() -> std::borrow::Cow<'static, str> {
                std::borrow::Cow::Borrowed(stringify!($name))
            }
        }
        impl $name {
            pub const ALL: &'static [$name] = &[$($name::$variant),+];
            pub fn as_str(self) -> &'static str { match self { $($name::$variant => $text),+ } }
            /// Exact upper-case name only (CONTRACT §3.2: enums accept no other spelling).
            pub fn parse(s: &str) -> Option<Self> { match s { $($text => Some($name::$variant),)+ _ => None } }
        }
        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result { f.write_str(self.as_str()) }
        }
    };
}

string_enum!(
    /// The 17 run statuses (§2.1).
    RunStatus {
        Created = "CREATED",
        Extracting = "EXTRACTING",
        ExtractedValidated = "EXTRACTED_VALIDATED",
        StageValidating = "STAGE_VALIDATING",
        StagingValidated = "STAGING_VALIDATED",
        Publishing = "PUBLISHING",
        Published = "PUBLISHED",
        Success = "SUCCESS",
        FailedManifest = "FAILED_MANIFEST",
        FailedExtract = "FAILED_EXTRACT",
        FailedStageValidation = "FAILED_STAGE_VALIDATION",
        FailedPublish = "FAILED_PUBLISH",
        PublishUnknown = "PUBLISH_UNKNOWN",
        FailedTargetValidation = "FAILED_TARGET_VALIDATION",
        FailedSnapshotExpired = "FAILED_SNAPSHOT_EXPIRED",
        TimedOut = "TIMED_OUT",
        Cancelled = "CANCELLED",
    }
);

string_enum!(
    /// The 7 partition statuses (§2.3).
    PartitionStatus {
        Pending = "PENDING",
        Running = "RUNNING",
        Retry = "RETRY",
        Success = "SUCCESS",
        Failed = "FAILED",
        TimedOut = "TIMED_OUT",
        Aborted = "ABORTED",
    }
);

string_enum!(
    /// Outbox row states (§2.5).
    DispatchStatus { Pending = "PENDING", Sent = "SENT", Acked = "ACKED", Dead = "DEAD" }
);

string_enum!(
    /// Outbox row kinds (§6.1).
    DispatchType { ValidateRun = "VALIDATE_RUN", ReissuePartition = "REISSUE_PARTITION" }
);

impl RunStatus {
    /// The `uq_load_run_active` set: blocks a new run for the same key.
    pub fn is_active(self) -> bool {
        use RunStatus::*;
        matches!(
            self,
            Created
                | Extracting
                | ExtractedValidated
                | StageValidating
                | StagingValidated
                | Publishing
                | Published
                | PublishUnknown
        )
    }

    pub fn is_terminal(self) -> bool {
        !self.is_active()
    }

    /// Terminal statuses retained by `cleanup.failed_retention` (CANCELLED and TIMED_OUT included).
    pub fn is_failed_class(self) -> bool {
        self.is_terminal() && self != RunStatus::Success
    }
}

impl PartitionStatus {
    pub fn is_final(self) -> bool {
        use PartitionStatus::*;
        matches!(self, Success | Failed | TimedOut | Aborted)
    }
}

/// The five `(expectedStatus, failStatus)` pairs `POST /v1/runs/{id}/fail` accepts (§2.2).
pub fn fail_transition_allowed(expected: RunStatus, fail: RunStatus) -> bool {
    use RunStatus::*;
    matches!(
        (expected, fail),
        (Created, FailedManifest)
            | (Extracting, FailedExtract)
            | (StageValidating, FailedStageValidation)
            | (StagingValidated, FailedPublish)
            | (Published, FailedTargetValidation)
    )
}

/// A partition failure whose Oracle error means the snapshot is gone ends the run as
/// FAILED_SNAPSHOT_EXPIRED instead of FAILED_EXTRACT (§4.8).
pub fn is_snapshot_failure(error_code: &str, error_class: &str) -> bool {
    let code = error_code.to_uppercase();
    code == "ORA-01555" || code == "ORA-08180" || error_class.to_uppercase() == "SNAPSHOT"
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_partition_the_seventeen_statuses() {
        assert_eq!(RunStatus::ALL.len(), 17);
        assert_eq!(RunStatus::ALL.iter().filter(|s| s.is_active()).count(), 8);
        assert_eq!(
            RunStatus::ALL
                .iter()
                .filter(|s| s.is_failed_class())
                .count(),
            8
        );
        assert!(RunStatus::PublishUnknown.is_active());
        assert!(RunStatus::Cancelled.is_failed_class());
    }

    #[test]
    fn exactly_five_fail_pairs_are_allowed() {
        let mut allowed = 0;
        for &e in RunStatus::ALL {
            for &f in RunStatus::ALL {
                allowed += fail_transition_allowed(e, f) as usize;
            }
        }
        assert_eq!(allowed, 5);
        assert!(fail_transition_allowed(
            RunStatus::Published,
            RunStatus::FailedTargetValidation
        ));
        assert!(!fail_transition_allowed(
            RunStatus::Extracting,
            RunStatus::Cancelled
        ));
        assert!(!fail_transition_allowed(
            RunStatus::Publishing,
            RunStatus::FailedPublish
        ));
    }

    #[test]
    fn names_round_trip_and_reject_other_spellings() {
        for &s in RunStatus::ALL {
            assert_eq!(RunStatus::parse(s.as_str()), Some(s));
        }
        assert_eq!(RunStatus::parse("created"), None);
        assert_eq!(
            PartitionStatus::parse("ABORTED"),
            Some(PartitionStatus::Aborted)
        );
    }

    #[test]
    fn snapshot_failures_are_recognised_case_insensitively() {
        assert!(is_snapshot_failure("ora-01555", "DB"));
        assert!(is_snapshot_failure("ORA-08180", ""));
        assert!(is_snapshot_failure("X", "snapshot"));
        assert!(!is_snapshot_failure("ORA-00001", "DB"));
    }
}
