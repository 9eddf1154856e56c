//! `loadctl dashboard`: the live terminal view — counts by status, the dispatch backlog, alerts
//! (sorted as the monitor summary sorts them), recent runs with progress, and a run's detail with
//! tabs; keys resend, resolve and cancel, each behind a confirmation with Cancel focused.
pub mod app;
pub mod ui;

use crate::client::Api;
use app::{Action, App, Key};
use ratatui::crossterm::event::{self, Event, KeyCode, KeyEventKind};
use std::time::{Duration, Instant};

fn key(code: KeyCode) -> Option<Key> {
    Some(match code {
        KeyCode::Up => Key::Up,
        KeyCode::Down => Key::Down,
        KeyCode::Left => Key::Left,
        KeyCode::Right => Key::Right,
        KeyCode::Tab | KeyCode::BackTab => Key::Tab,
        KeyCode::Enter => Key::Enter,
        KeyCode::Esc => Key::Esc,
        KeyCode::Backspace => Key::Backspace,
        KeyCode::Char(c) => Key::Char(c),
        _ => return None,
    })
}

/// Runs until `q`: refreshes every `refresh`, and at once after each action.
pub async fn run(api: Api, server: &str, refresh: Duration) -> anyhow::Result<()> {
    let mut app = App::new(server, refresh);
    app.load(&api).await;
    let mut terminal = ratatui::init();
    let result = async {
        let mut last = Instant::now();
        loop {
            terminal.draw(|f| ui::draw(f, &app))?;
            let wait = refresh
                .saturating_sub(last.elapsed())
                .min(Duration::from_millis(250));
            if event::poll(wait)?
                && let Event::Key(k) = event::read()?
                && k.kind == KeyEventKind::Press
                && let Some(k) = key(k.code)
            {
                match app.on_key(k) {
                    Action::Quit => return Ok(()),
                    Action::None => continue,
                    Action::Refresh => {}
                    action => app.perform(&api, &action).await,
                }
                app.load(&api).await;
                last = Instant::now();
            } else if last.elapsed() >= refresh {
                app.load(&api).await;
                last = Instant::now();
            }
        }
    }
    .await;
    ratatui::restore();
    result
}
