//! The dashboard's state and what each key does: pure, so every screen and dialog is tested
//! without a terminal. Keys never call the API themselves; they return an [`Action`] that the
//! loop (or a test) carries out, then the state is refreshed.
use crate::client::{Api, Failure};
use serde_json::{Value, json};
use std::time::Duration;

/// The tabs of a run's detail.
pub const TABS: [&str; 4] = ["Partitions", "Metrics", "Dispatches", "Events"];

/// Outcomes offered when resolving PUBLISH_UNKNOWN.
pub const OUTCOMES: [&str; 2] = ["PUBLISHED", "FAILED_PUBLISH"];

/// A reason must have at least this many characters (the API's rule).
pub const MIN_REASON: usize = 5;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Key {
    Up,
    Down,
    Left,
    Right,
    Tab,
    Enter,
    Esc,
    Backspace,
    Char(char),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Focus {
    Alerts,
    Runs,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Screen {
    Overview,
    Detail {
        run_id: String,
        tab: usize,
        cursor: usize,
    },
}

/// What a dialog is about to do.
#[derive(Debug, Clone, PartialEq)]
pub enum Intent {
    Resolve { run_id: String, outcome: usize },
    Cancel { run_id: String },
    Resend { run_id: String, dispatch_id: String },
}

#[derive(Debug, Clone, PartialEq)]
pub struct Dialog {
    pub intent: Intent,
    pub reason: String,
    /// Second step: "are you sure", with Cancel focused until Tab moves to Confirm.
    pub confirming: bool,
    pub confirm_focused: bool,
    pub hint: Option<String>,
}

/// What the loop must do after a key.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    None,
    Quit,
    Refresh,
    Resolve {
        run_id: String,
        outcome: &'static str,
        reason: String,
    },
    Cancel {
        run_id: String,
        reason: String,
    },
    Resend {
        run_id: String,
        dispatch_id: String,
    },
}

pub struct App {
    pub server: String,
    pub refresh: Duration,
    pub summary: Option<Value>,
    pub runs: Vec<Value>,
    /// Run detail, metrics and events of the open run.
    pub detail: Option<Value>,
    pub screen: Screen,
    pub focus: Focus,
    pub alert_cursor: usize,
    pub run_cursor: usize,
    pub dialog: Option<Dialog>,
    /// The last action's result, or the last refresh error ("no permission" for a 403).
    pub status: String,
    pub refreshed_at: String,
}

/// An alert's identity across refreshes (the cursor follows it, not its position).
fn alert_key(a: &Value) -> (String, String, String) {
    let s = |k: &str| a[k].as_str().unwrap_or_default().to_string();
    (s("kind"), s("runId"), s("dispatchId"))
}

impl App {
    pub fn new(server: &str, refresh: Duration) -> App {
        App {
            server: server.to_string(),
            refresh,
            summary: None,
            runs: vec![],
            detail: None,
            screen: Screen::Overview,
            focus: Focus::Alerts,
            alert_cursor: 0,
            run_cursor: 0,
            dialog: None,
            status: String::new(),
            refreshed_at: String::new(),
        }
    }

    pub fn alerts(&self) -> &[Value] {
        self.summary
            .as_ref()
            .and_then(|s| s["alerts"].as_array())
            .map(Vec::as_slice)
            .unwrap_or_default()
    }

    /// New data from the API; the alert cursor stays on the same alert when it is still there.
    pub fn set_overview(&mut self, summary: Value, runs: Vec<Value>) {
        let selected = self.alerts().get(self.alert_cursor).map(alert_key);
        self.summary = Some(summary);
        self.runs = runs;
        let alerts = self.alerts();
        self.alert_cursor = selected
            .and_then(|k| alerts.iter().position(|a| alert_key(a) == k))
            .unwrap_or(self.alert_cursor)
            .min(alerts.len().saturating_sub(1));
        self.run_cursor = self.run_cursor.min(self.runs.len().saturating_sub(1));
    }

    pub fn detail_rows(&self, tab: usize) -> Vec<Value> {
        let Some(d) = &self.detail else { return vec![] };
        let list = match tab {
            0 => &d["run"]["partitions"],
            1 => &d["validations"]["metrics"],
            2 => &d["run"]["dispatches"],
            _ => &d["events"]["events"],
        };
        list.as_array().cloned().unwrap_or_default()
    }

    fn open_run(&self) -> Option<String> {
        match self.focus {
            Focus::Alerts => self.alerts().get(self.alert_cursor)?["runId"]
                .as_str()
                .map(str::to_string),
            Focus::Runs => self.runs.get(self.run_cursor)?["runId"]
                .as_str()
                .map(str::to_string),
        }
    }

    fn dialog(intent: Intent) -> Option<Dialog> {
        Some(Dialog {
            intent,
            reason: String::new(),
            confirming: false,
            confirm_focused: false,
            hint: None,
        })
    }

    /// What a key does on the current screen or dialog.
    pub fn on_key(&mut self, key: Key) -> Action {
        if let Some(mut d) = self.dialog.take() {
            // Enter while Cancel is focused on the confirmation closes the dialog; so does Esc.
            let cancelled =
                key == Key::Esc || (key == Key::Enter && d.confirming && !d.confirm_focused);
            let action = self.dialog_key(&mut d, key);
            if matches!(action, Action::None) && !cancelled {
                self.dialog = Some(d);
            }
            return action;
        }
        match (&mut self.screen, key) {
            (_, Key::Char('q')) => Action::Quit,
            (_, Key::Char('r')) => Action::Refresh,
            (Screen::Overview, Key::Tab) => {
                self.focus = if self.focus == Focus::Alerts {
                    Focus::Runs
                } else {
                    Focus::Alerts
                };
                Action::None
            }
            (Screen::Overview, Key::Up) => {
                match self.focus {
                    Focus::Alerts => self.alert_cursor = self.alert_cursor.saturating_sub(1),
                    Focus::Runs => self.run_cursor = self.run_cursor.saturating_sub(1),
                }
                Action::None
            }
            (Screen::Overview, Key::Down) => {
                match self.focus {
                    Focus::Alerts => {
                        self.alert_cursor =
                            (self.alert_cursor + 1).min(self.alerts().len().saturating_sub(1))
                    }
                    Focus::Runs => {
                        self.run_cursor =
                            (self.run_cursor + 1).min(self.runs.len().saturating_sub(1))
                    }
                }
                Action::None
            }
            (Screen::Overview, Key::Enter) => match self.open_run() {
                Some(run_id) => {
                    self.screen = Screen::Detail {
                        run_id,
                        tab: 0,
                        cursor: 0,
                    };
                    self.detail = None;
                    Action::Refresh
                }
                None => Action::None,
            },
            (Screen::Detail { .. }, Key::Esc) => {
                self.screen = Screen::Overview;
                self.detail = None;
                Action::None
            }
            (Screen::Detail { tab, cursor, .. }, Key::Right) => {
                *tab = (*tab + 1) % TABS.len();
                *cursor = 0;
                Action::None
            }
            (Screen::Detail { tab, cursor, .. }, Key::Left) => {
                *tab = (*tab + TABS.len() - 1) % TABS.len();
                *cursor = 0;
                Action::None
            }
            (Screen::Detail { tab, cursor, .. }, Key::Char(c @ '1'..='4')) => {
                *tab = c as usize - '1' as usize;
                *cursor = 0;
                Action::None
            }
            (Screen::Detail { cursor, .. }, Key::Up) => {
                *cursor = cursor.saturating_sub(1);
                Action::None
            }
            (Screen::Detail { tab, cursor, .. }, Key::Down) => {
                let (t, c) = (*tab, *cursor);
                let n = self.detail_rows(t).len();
                if let Screen::Detail { cursor, .. } = &mut self.screen {
                    *cursor = (c + 1).min(n.saturating_sub(1));
                }
                Action::None
            }
            (Screen::Detail { run_id, .. }, Key::Char('R')) => {
                let run_id = run_id.clone();
                if self.detail_status() == Some("PUBLISH_UNKNOWN") {
                    self.dialog = Self::dialog(Intent::Resolve { run_id, outcome: 0 });
                } else {
                    self.status = "only a PUBLISH_UNKNOWN run is resolved".into();
                }
                Action::None
            }
            (Screen::Detail { run_id, .. }, Key::Char('c')) => {
                self.dialog = Self::dialog(Intent::Cancel {
                    run_id: run_id.clone(),
                });
                Action::None
            }
            (
                Screen::Detail {
                    run_id,
                    tab,
                    cursor,
                },
                Key::Char('s'),
            ) => {
                let (run_id, tab, cursor) = (run_id.clone(), *tab, *cursor);
                let dispatch = (tab == 2)
                    .then(|| {
                        self.detail_rows(2).get(cursor)?["dispatchId"]
                            .as_str()
                            .map(str::to_string)
                    })
                    .flatten();
                match dispatch {
                    Some(dispatch_id) => {
                        let mut d = Self::dialog(Intent::Resend {
                            run_id,
                            dispatch_id,
                        });
                        if let Some(d) = d.as_mut() {
                            d.confirming = true; // nothing to type: straight to the confirmation
                        }
                        self.dialog = d;
                    }
                    None => {
                        self.status = "select a dispatch in the Dispatches tab to resend it".into()
                    }
                }
                Action::None
            }
            _ => Action::None,
        }
    }

    fn dialog_key(&mut self, d: &mut Dialog, key: Key) -> Action {
        if key == Key::Esc {
            return Action::None;
        }
        if d.confirming {
            return match key {
                Key::Tab | Key::Left | Key::Right => {
                    d.confirm_focused = !d.confirm_focused;
                    Action::None
                }
                Key::Enter if d.confirm_focused => match &d.intent {
                    Intent::Resolve { run_id, outcome } => Action::Resolve {
                        run_id: run_id.clone(),
                        outcome: OUTCOMES[*outcome],
                        reason: d.reason.trim().to_string(),
                    },
                    Intent::Cancel { run_id } => Action::Cancel {
                        run_id: run_id.clone(),
                        reason: d.reason.trim().to_string(),
                    },
                    Intent::Resend {
                        run_id,
                        dispatch_id,
                    } => Action::Resend {
                        run_id: run_id.clone(),
                        dispatch_id: dispatch_id.clone(),
                    },
                },
                _ => Action::None,
            };
        }
        match key {
            Key::Up | Key::Down => {
                if let Intent::Resolve { outcome, .. } = &mut d.intent {
                    *outcome = (*outcome + 1) % OUTCOMES.len();
                }
            }
            Key::Backspace => {
                d.reason.pop();
            }
            Key::Char(c) => d.reason.push(c),
            Key::Enter => {
                if d.reason.trim().chars().count() < MIN_REASON {
                    d.hint = Some(format!("a reason of at least {MIN_REASON} characters"));
                } else {
                    d.confirming = true;
                    d.confirm_focused = false;
                    d.hint = None;
                }
            }
            _ => {}
        }
        Action::None
    }

    pub fn detail_status(&self) -> Option<&str> {
        self.detail.as_ref()?["run"]["status"].as_str()
    }

    /// Loads what the current screen shows.
    pub async fn load(&mut self, api: &Api) {
        let result = match &self.screen {
            Screen::Overview => {
                let summary = api.get("/v1/monitor/summary", &[]).await;
                let runs = api.get("/v1/runs", &[("limit", "20".into())]).await;
                summary.and_then(|s| runs.map(|r| (s, r))).map(|(s, r)| {
                    self.set_overview(s, r.as_array().cloned().unwrap_or_default());
                })
            }
            Screen::Detail { run_id, .. } => {
                let run_id = run_id.clone();
                let detail = async {
                    let run = api.get(&format!("/v1/runs/{run_id}"), &[]).await?;
                    let metrics = api
                        .get(&format!("/v1/runs/{run_id}/validations"), &[])
                        .await?;
                    let events = api.get(&format!("/v1/runs/{run_id}/events"), &[]).await?;
                    Ok::<_, Failure>(json!({"run": run, "validations": metrics, "events": events}))
                };
                detail.await.map(|d| self.detail = Some(d))
            }
        };
        match result {
            Ok(()) => {
                self.refreshed_at = now_hms();
                if self.status.starts_with("no permission") || self.status.starts_with("cannot") {
                    self.status.clear();
                }
            }
            Err(Failure::Denied { status: 403, .. }) => {
                self.status = "no permission: this token cannot read runs".into()
            }
            Err(e) => self.status = format!("cannot refresh: {e}"),
        }
    }

    /// Carries out an action's API call; the answer goes to the status line.
    pub async fn perform(&mut self, api: &Api, action: &Action) {
        let result = match action {
            Action::Resolve {
                run_id,
                outcome,
                reason,
            } => {
                api.act(
                    &format!("/v1/runs/{run_id}/publish-unknown/resolve"),
                    Some(json!({"resolution": outcome, "reason": reason})),
                )
                .await
            }
            Action::Cancel { run_id, reason } => {
                api.act(
                    &format!("/v1/runs/{run_id}/cancel"),
                    Some(json!({"reason": reason})),
                )
                .await
            }
            Action::Resend {
                run_id,
                dispatch_id,
            } => {
                api.act(
                    &format!("/v1/runs/{run_id}/dispatches/{dispatch_id}/resend"),
                    None,
                )
                .await
            }
            _ => return,
        };
        self.status = match result {
            Ok(v) => format!(
                "done: run {} {}",
                v["runStatus"]
                    .as_str()
                    .or(v["status"].as_str())
                    .unwrap_or("?"),
                if v["changed"] == json!(false) {
                    "(nothing changed)"
                } else {
                    ""
                }
            )
            .trim_end()
            .to_string(),
            Err(Failure::Denied { status: 403, .. }) => {
                "no permission: actions need a token with the operator role".into()
            }
            Err(e) => format!("refused: {e}"),
        };
    }
}

fn now_hms() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    format!(
        "{:02}:{:02}:{:02} UTC",
        secs / 3600 % 24,
        secs / 60 % 60,
        secs % 60
    )
}
