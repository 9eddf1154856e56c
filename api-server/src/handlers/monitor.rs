//! The monitor summary (§4.20).
use super::prelude::*;

v1_operation! {
    get "/v1/monitor/summary", "Monitor summary.",
    params = [("alertLimit" = Option<i64>, Query, minimum = 1, maximum = 500)],
    ok = [ledger::MonitorSummary];
    pub async fn monitor_summary(
        State(s): State<AppState>,
        _c: ReadCaller,
        req: Request,
    ) -> ApiResult<ledger::MonitorSummary> {
        let mut input = Input::read(&s, req, BodyMode::Ignored).await?;
        let limit = requests::query_int(&input.query, "alertLimit", 1, 500, 100, &mut input.problems);
        input.problems.check()?;
        Ok(Json(s.0.ledger.monitor_summary(limit).await?))
    }
}
