//! Drawing the dashboard (fits 80×24): the overview (counts, dispatch backlog, alerts, recent
//! runs), a run's detail with tabs, and the confirmation dialogs.
use super::app::{App, Dialog, Focus, Intent, OUTCOMES, Screen, TABS};
use crate::render::s;

fn counts(m: &Value) -> String {
    crate::render::counts(m, "  ")
}
use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{
    Block, Borders, Cell, Clear, Paragraph, Row, Table, TableState, Tabs, Wrap,
};
use serde_json::Value;

fn time(v: &Value) -> String {
    match v.as_str() {
        Some(t) if t.len() >= 19 => t[11..19].to_string(),
        _ => s(v),
    }
}

/// `▮▮▮▯▯ 3/5`
fn progress(done: &Value, total: &Value) -> String {
    let (d, t) = (done.as_i64().unwrap_or(0), total.as_i64().unwrap_or(0));
    if t <= 0 {
        return "-".into();
    }
    let filled = ((d * 5 + t - 1) / t).clamp(0, 5) as usize;
    format!("{}{} {d}/{t}", "▮".repeat(filled), "▯".repeat(5 - filled))
}

/// A detail tab's table: column titles, widths, and the cells of one row.
type TabTable = (
    Vec<&'static str>,
    Vec<Constraint>,
    fn(&Value) -> Vec<String>,
);

const SELECTED: Style = Style::new().add_modifier(Modifier::REVERSED);

pub fn draw(f: &mut Frame, app: &App) {
    let [header, body, footer] = Layout::vertical([
        Constraint::Length(1),
        Constraint::Min(5),
        Constraint::Length(1),
    ])
    .areas(f.area());
    let title = format!(
        " load-control  {}  refreshed {} every {}s",
        app.server,
        if app.refreshed_at.is_empty() {
            "-"
        } else {
            &app.refreshed_at
        },
        app.refresh.as_secs()
    );
    f.render_widget(
        Paragraph::new(title).style(Style::new().add_modifier(Modifier::BOLD)),
        header,
    );
    match &app.screen {
        Screen::Overview => overview(f, app, body),
        Screen::Detail {
            run_id,
            tab,
            cursor,
        } => detail(f, app, body, run_id, *tab, *cursor),
    }
    let keys = match (&app.screen, &app.dialog) {
        (_, Some(_)) => "type the reason  ↑↓ outcome  Enter next  Tab switch  Esc close",
        (Screen::Overview, None) => "↑↓ move  Tab alerts/runs  Enter open  r refresh  q quit",
        (Screen::Detail { .. }, None) => {
            "←→ tabs  ↑↓ move  R resolve  c cancel  s resend  Esc back  q quit"
        }
    };
    let status = if app.status.is_empty() {
        keys.to_string()
    } else {
        format!("{}  |  {keys}", app.status)
    };
    let style = if app.status.starts_with("no permission")
        || app.status.starts_with("refused")
        || app.status.starts_with("cannot")
    {
        Style::new().fg(Color::Red)
    } else {
        Style::new().fg(Color::DarkGray)
    };
    f.render_widget(Paragraph::new(status).style(style), footer);
    if let Some(d) = &app.dialog {
        dialog(f, d);
    }
}

fn overview(f: &mut Frame, app: &App, area: Rect) {
    let [summary, alerts, runs] = Layout::vertical([
        Constraint::Length(4),
        Constraint::Min(4),
        Constraint::Min(4),
    ])
    .areas(area);
    let sm = app.summary.clone().unwrap_or(Value::Null);
    let lines = vec![
        Line::from(format!("Active   {}", counts(&sm["activeRuns"]))),
        Line::from(format!("Last 24h {}", counts(&sm["recentRuns"]))),
        Line::from(format!(
            "Backlog  {}   cleanup due {}",
            counts(&sm["dispatches"]),
            s(&sm["cleanupDue"])
        )),
    ];
    f.render_widget(
        Paragraph::new(lines).block(Block::new().borders(Borders::TOP).title(" Runs ")),
        summary,
    );

    let focused = |yes: bool| {
        if yes {
            Style::new().fg(Color::Cyan)
        } else {
            Style::new()
        }
    };
    let alert_rows: Vec<Row> = app
        .alerts()
        .iter()
        .map(|a| {
            let sev = s(&a["severity"]);
            let color = if sev == "ERROR" {
                Color::Red
            } else {
                Color::Yellow
            };
            Row::new(vec![
                Cell::from(sev).style(Style::new().fg(color)),
                Cell::from(s(&a["kind"])),
                Cell::from(format!("{} {}", s(&a["jobKey"]), s(&a["businessKey"]))),
                Cell::from(s(&a["status"])),
                Cell::from(s(&a["message"])),
            ])
        })
        .collect();
    let block = Block::new()
        .borders(Borders::TOP)
        .title(" Alerts ")
        .border_style(focused(app.focus == Focus::Alerts));
    if alert_rows.is_empty() {
        f.render_widget(Paragraph::new("No alerts.").block(block), alerts);
    } else {
        let table = Table::new(
            alert_rows,
            [
                Constraint::Length(5),
                Constraint::Length(16),
                Constraint::Length(24),
                Constraint::Length(15),
                Constraint::Min(10),
            ],
        )
        .block(block)
        .row_highlight_style(SELECTED);
        let mut st = TableState::default()
            .with_selected((app.focus == Focus::Alerts).then_some(app.alert_cursor));
        f.render_stateful_widget(table, alerts, &mut st);
    }

    let run_rows: Vec<Row> = app
        .runs
        .iter()
        .map(|r| {
            Row::new(vec![
                s(&r["jobKey"]),
                s(&r["businessKey"]),
                s(&r["status"]),
                progress(&r["successPartitionCount"], &r["expectedPartitionCount"]),
                time(&r["startedAt"]),
            ])
        })
        .collect();
    let block = Block::new()
        .borders(Borders::TOP)
        .title(" Recent runs ")
        .border_style(focused(app.focus == Focus::Runs));
    let table = Table::new(
        run_rows,
        [
            Constraint::Length(20),
            Constraint::Length(16),
            Constraint::Length(19),
            Constraint::Length(13),
            Constraint::Min(8),
        ],
    )
    .header(
        Row::new(vec![
            "JOB",
            "BUSINESS KEY",
            "STATUS",
            "PARTITIONS",
            "STARTED",
        ])
        .style(Style::new().add_modifier(Modifier::BOLD)),
    )
    .block(block)
    .row_highlight_style(SELECTED);
    let mut st =
        TableState::default().with_selected((app.focus == Focus::Runs).then_some(app.run_cursor));
    f.render_stateful_widget(table, runs, &mut st);
}

fn detail(f: &mut Frame, app: &App, area: Rect, run_id: &str, tab: usize, cursor: usize) {
    let [head, tabs, body] = Layout::vertical([
        Constraint::Length(3),
        Constraint::Length(1),
        Constraint::Min(3),
    ])
    .areas(area);
    let r = app
        .detail
        .as_ref()
        .map(|d| d["run"].clone())
        .unwrap_or(Value::Null);
    let lines = vec![
        Line::from(vec![
            Span::styled(
                format!("{} / {}", s(&r["jobKey"]), s(&r["businessKey"])),
                Style::new().add_modifier(Modifier::BOLD),
            ),
            Span::raw(format!("  {run_id}")),
        ]),
        Line::from(format!(
            "{}  partitions {}  rows {}/{}",
            s(&r["status"]),
            progress(&r["successPartitionCount"], &r["expectedPartitionCount"]),
            s(&r["extractedCount"]),
            s(&r["sourceCount"])
        )),
        Line::from(match r["errorCode"].as_str() {
            Some(code) => format!("error {code}: {}", s(&r["errorMessage"])),
            None => String::new(),
        }),
    ];
    f.render_widget(Paragraph::new(lines).wrap(Wrap { trim: true }), head);
    f.render_widget(
        Tabs::new(TABS.to_vec())
            .select(tab)
            .highlight_style(SELECTED),
        tabs,
    );
    let rows = app.detail_rows(tab);
    let (header, widths, cells): TabTable = match tab {
        0 => (
            vec!["PARTITION", "STATUS", "ROWS", "FILES", "TRY", "WORKER"],
            vec![
                Constraint::Length(9),
                Constraint::Length(10),
                Constraint::Length(13),
                Constraint::Length(5),
                Constraint::Length(3),
                Constraint::Min(8),
            ],
            |p| {
                vec![
                    s(&p["partitionId"]),
                    s(&p["status"]),
                    format!("{}/{}", s(&p["actualRowCount"]), s(&p["expectedRowCount"])),
                    s(&p["fileCount"]),
                    s(&p["attemptCount"]),
                    s(&p["workerNode"]),
                ]
            },
        ),
        1 => (
            vec!["STAGE", "METRIC", "EXPECTED", "ACTUAL", "RESULT"],
            vec![
                Constraint::Length(7),
                Constraint::Length(20),
                Constraint::Length(14),
                Constraint::Length(14),
                Constraint::Min(6),
            ],
            |m| {
                vec![
                    s(&m["stage"]),
                    s(&m["metricName"]),
                    s(&m["expectedValue"]),
                    s(&m["actualValue"]),
                    s(&m["result"]),
                ]
            },
        ),
        2 => (
            vec!["DISPATCH", "TYPE", "PART", "STATUS", "TRY", "SENT"],
            vec![
                Constraint::Length(10),
                Constraint::Length(17),
                Constraint::Length(4),
                Constraint::Length(7),
                Constraint::Length(3),
                Constraint::Min(8),
            ],
            |d| {
                vec![
                    s(&d["dispatchId"]).chars().take(8).collect(),
                    s(&d["dispatchType"]),
                    s(&d["partitionId"]),
                    s(&d["status"]),
                    s(&d["attemptCount"]),
                    time(&d["sentAt"]),
                ]
            },
        ),
        _ => (
            vec!["TIME", "LEVEL", "EVENT", "MESSAGE"],
            vec![
                Constraint::Length(8),
                Constraint::Length(5),
                Constraint::Length(24),
                Constraint::Min(10),
            ],
            |e| {
                vec![
                    time(&e["eventTime"]),
                    s(&e["level"]),
                    s(&e["name"]),
                    s(&e["message"]),
                ]
            },
        ),
    };
    let table = Table::new(
        rows.iter().map(|v| Row::new(cells(v))).collect::<Vec<_>>(),
        widths,
    )
    .header(Row::new(header).style(Style::new().add_modifier(Modifier::BOLD)))
    .block(Block::new().borders(Borders::TOP))
    .row_highlight_style(SELECTED);
    let mut st = TableState::default().with_selected((!rows.is_empty()).then_some(cursor));
    f.render_stateful_widget(table, body, &mut st);
}

fn dialog(f: &mut Frame, d: &Dialog) {
    let area = f.area();
    let w = area.width.min(64);
    let rect = Rect {
        x: area.x + (area.width - w) / 2,
        y: area.y + area.height.saturating_sub(10) / 2,
        width: w,
        height: 10.min(area.height),
    };
    f.render_widget(Clear, rect);
    let (title, what) = match &d.intent {
        Intent::Resolve { run_id, outcome } => (
            " Resolve PUBLISH_UNKNOWN ",
            vec![
                format!("run {run_id}"),
                format!("outcome: {}  (↑↓ to change)", OUTCOMES[*outcome]),
                "Check the target table in Hive before you resolve.".into(),
            ],
        ),
        Intent::Cancel { run_id } => (
            " Cancel run ",
            vec![
                format!("run {run_id}"),
                "Unfinished partitions are aborted.".into(),
                String::new(),
            ],
        ),
        Intent::Resend {
            run_id,
            dispatch_id,
        } => (
            " Resend dispatch ",
            vec![
                format!("run {run_id}"),
                format!("dispatch {dispatch_id}"),
                String::new(),
            ],
        ),
    };
    let mut lines: Vec<Line> = what.into_iter().map(Line::from).collect();
    if !matches!(d.intent, Intent::Resend { .. }) {
        lines.push(Line::from(format!(
            "reason: {}{}",
            d.reason,
            if d.confirming { "" } else { "▏" }
        )));
    }
    if let Some(h) = &d.hint {
        lines.push(Line::styled(h.clone(), Style::new().fg(Color::Red)));
    }
    if d.confirming {
        let button = |label: &str, on: bool| {
            Span::styled(
                format!("[ {label} ]"),
                if on { SELECTED } else { Style::new() },
            )
        };
        lines.push(Line::from(""));
        lines.push(Line::from(vec![
            Span::raw("Are you sure?  "),
            button("Cancel", !d.confirm_focused),
            Span::raw("  "),
            button("Confirm", d.confirm_focused),
        ]));
    }
    f.render_widget(
        Paragraph::new(lines)
            .block(Block::new().borders(Borders::ALL).title(title))
            .wrap(Wrap { trim: false }),
        rect,
    );
}
