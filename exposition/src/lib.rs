//! Which text a `/metrics` scrape gets, chosen from its `Accept` header as Prometheus's
//! client_golang chooses it (`expfmt.NegotiateIncludingOpenMetrics`): OpenMetrics 1.0.0 when the
//! scraper asks for `application/openmetrics-text`, otherwise the classic text format
//! (`text/plain; version=0.0.4`), also when there is no `Accept` at all. Never a 406: a scraper
//! that asks for something else (protobuf) gets the classic text, as from client_golang.
//!
//! prometheus-client writes only OpenMetrics; [`classic_text`] rewrites that into the classic
//! format, so one registry serves both.

/// The OpenMetrics content type prometheus-client's text encoder writes.
pub const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
/// The classic Prometheus text format.
pub const CLASSIC_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The format a scrape asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    OpenMetrics,
    ClassicText,
}

impl Format {
    /// Chosen from the `Accept` header (absent, empty or unparsable: the classic text). Among the
    /// media ranges that name OpenMetrics or the classic text (`text/plain`, `text/*`, `*/*`),
    /// the highest `q` wins, the first on a tie; `q=0` refuses a range.
    pub fn negotiate(accept: Option<&str>) -> Format {
        let mut best: Option<(f32, Format)> = None;
        for range in accept.unwrap_or("").split(',') {
            let mut parts = range.split(';');
            let media = parts.next().unwrap_or("").trim().to_ascii_lowercase();
            let format = match media.as_str() {
                "application/openmetrics-text" => Format::OpenMetrics,
                "text/plain" | "text/*" | "*/*" => Format::ClassicText,
                _ => continue,
            };
            let q = parts
                .filter_map(|p| p.split_once('='))
                .find(|(k, _)| k.trim().eq_ignore_ascii_case("q"))
                .map_or(Some(1.0), |(_, v)| v.trim().parse::<f32>().ok())
                .unwrap_or(0.0);
            if q > 0.0 && best.is_none_or(|(b, _)| q > b) {
                best = Some((q, format));
            }
        }
        best.map_or(Format::ClassicText, |(_, f)| f)
    }

    pub fn content_type(self) -> &'static str {
        match self {
            Format::OpenMetrics => OPENMETRICS,
            Format::ClassicText => CLASSIC_TEXT,
        }
    }

    /// The content type and body a scrape with this `Accept` gets, from prometheus-client's
    /// OpenMetrics text: what both binaries' `/metrics` answer.
    pub fn respond(accept: Option<&str>, openmetrics: String) -> (&'static str, String) {
        let format = Format::negotiate(accept);
        (format.content_type(), format.body(openmetrics))
    }

    /// The body in this format, from prometheus-client's OpenMetrics text.
    pub fn body(self, openmetrics: String) -> String {
        match self {
            Format::OpenMetrics => openmetrics,
            Format::ClassicText => classic_text(&openmetrics),
        }
    }
}

/// OpenMetrics text rewritten into the classic format, as client_golang writes it: a counter's
/// family takes its samples' `_total` name in `# HELP`/`# TYPE`; `info` and `stateset` become
/// gauges (`_info` named), `unknown` and `gaugehistogram` untyped; `# UNIT`, `# EOF`, the
/// `_created` samples and exemplars are dropped.
pub fn classic_text(openmetrics: &str) -> String {
    let mut out = String::with_capacity(openmetrics.len());
    // The family's HELP text, held until its TYPE line names the family (prometheus-client writes
    // HELP first; a counter's classic name is only known from its type).
    let mut help: Option<(&str, &str)> = None;
    // The family being written (its OpenMetrics name).
    let mut family = "";
    for line in openmetrics.lines() {
        if let Some(meta) = line.strip_prefix("# ") {
            let mut words = meta.splitn(3, ' ');
            let (kind, name, rest) = (
                words.next().unwrap_or(""),
                words.next().unwrap_or(""),
                words.next().unwrap_or(""),
            );
            match kind {
                "HELP" => help = Some((name, rest)),
                "TYPE" => {
                    family = name;
                    let (classic, ty) = classic_family(name, rest);
                    if let Some((_, text)) = help.take().filter(|(n, _)| *n == name) {
                        out.push_str(&format!("# HELP {classic} {text}\n"));
                    }
                    out.push_str(&format!("# TYPE {classic} {ty}\n"));
                }
                _ => {} // UNIT, EOF
            }
            continue;
        }
        if line.is_empty() {
            continue;
        }
        // An exemplar (` # {…} value`) follows the label set, whose values may hold ` # `.
        let labels_end = label_set_end(line);
        let sample = match line[labels_end..].find(" # ") {
            Some(at) => &line[..labels_end + at],
            None => line,
        };
        let name = &sample[..sample.find(['{', ' ']).unwrap_or(sample.len())];
        if name.ends_with("_created") && name != family {
            continue;
        }
        out.push_str(sample);
        out.push('\n');
    }
    out
}

/// Where a sample's label set ends (after its `}`, quoted values skipped), or 0 without one.
fn label_set_end(line: &str) -> usize {
    let (mut quoted, mut escaped) = (false, false);
    for (i, c) in line.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' if quoted => escaped = true,
            '"' => quoted = !quoted,
            '}' if !quoted => return i + 1,
            ' ' if !quoted => return 0,
            _ => {}
        }
    }
    0
}

/// The classic family name and type of an OpenMetrics family.
fn classic_family<'a>(name: &'a str, ty: &str) -> (std::borrow::Cow<'a, str>, &'static str) {
    use std::borrow::Cow;
    match ty {
        "counter" => (Cow::Owned(format!("{name}_total")), "counter"),
        "gauge" => (Cow::Borrowed(name), "gauge"),
        "histogram" => (Cow::Borrowed(name), "histogram"),
        "summary" => (Cow::Borrowed(name), "summary"),
        "info" => (Cow::Owned(format!("{name}_info")), "gauge"),
        "stateset" => (Cow::Borrowed(name), "gauge"),
        _ => (Cow::Borrowed(name), "untyped"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::metrics::counter::Counter;
    use prometheus_client::metrics::gauge::Gauge;
    use prometheus_client::metrics::histogram::Histogram;
    use prometheus_client::metrics::info::Info;
    use prometheus_client::registry::{Registry, Unit};

    /// What prometheus-client writes for each kind of metric the binaries register.
    fn openmetrics() -> String {
        let mut r = Registry::default();
        let c = Counter::<u64>::default();
        c.inc_by(3);
        r.register("lc_requests", "Requests \"answered\"", c);
        let g = Gauge::<i64>::default();
        g.set(-2);
        r.register("lc_leader", "Leadership", g);
        let h = Histogram::new([0.1, 1.0]);
        h.observe(0.5);
        r.register_with_unit("lc_lock_wait", "Lock waits", Unit::Seconds, h);
        r.register("lc_build", "The build", Info::new(vec![("version", "1")]));
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &r).unwrap();
        out
    }

    #[test]
    fn the_classic_text_is_what_client_golang_writes() {
        let om = openmetrics();
        assert!(om.ends_with("# EOF\n"), "{om}");
        assert_eq!(
            classic_text(&om),
            "# HELP lc_requests_total Requests \"answered\".\n\
             # TYPE lc_requests_total counter\n\
             lc_requests_total 3\n\
             # HELP lc_leader Leadership.\n\
             # TYPE lc_leader gauge\n\
             lc_leader -2\n\
             # HELP lc_lock_wait_seconds Lock waits.\n\
             # TYPE lc_lock_wait_seconds histogram\n\
             lc_lock_wait_seconds_sum 0.5\n\
             lc_lock_wait_seconds_count 1\n\
             lc_lock_wait_seconds_bucket{le=\"0.1\"} 0\n\
             lc_lock_wait_seconds_bucket{le=\"1.0\"} 1\n\
             lc_lock_wait_seconds_bucket{le=\"+Inf\"} 1\n\
             # HELP lc_build_info The build.\n\
             # TYPE lc_build_info gauge\n\
             lc_build_info{version=\"1\"} 1\n",
            "from:\n{om}"
        );
    }

    #[test]
    fn exemplars_and_created_samples_are_dropped() {
        let om = "# HELP a A.\n# TYPE a counter\na_total{l=\"x # y\"} 1 # {trace_id=\"x\"} 1.0\na_created 17.0\n\
                  # TYPE b_created gauge\nb_created 2\n# EOF\n";
        assert_eq!(
            classic_text(om),
            "# HELP a_total A.\n# TYPE a_total counter\na_total{l=\"x # y\"} 1\n# TYPE b_created gauge\nb_created 2\n"
        );
    }

    #[test]
    fn negotiation_follows_client_golang() {
        use Format::*;
        // Prometheus 2.x and 3.x scrape requests.
        let prometheus = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
        assert_eq!(Format::negotiate(Some(prometheus)), OpenMetrics);
        let classic_first = "text/plain;version=0.0.4;q=1,application/openmetrics-text;q=0.5";
        assert_eq!(Format::negotiate(Some(classic_first)), ClassicText);
        assert_eq!(Format::negotiate(None), ClassicText);
        assert_eq!(Format::negotiate(Some("")), ClassicText);
        assert_eq!(Format::negotiate(Some("*/*")), ClassicText);
        assert_eq!(
            Format::negotiate(Some("application/vnd.google.protobuf")),
            ClassicText
        );
        assert_eq!(
            Format::negotiate(Some("Application/OpenMetrics-Text; version=1.0.0")),
            OpenMetrics
        );
        assert_eq!(
            Format::negotiate(Some("application/openmetrics-text;q=0, text/plain")),
            ClassicText
        );
        assert_eq!(
            Format::negotiate(Some("application/openmetrics-text;q=x")),
            ClassicText
        );
    }
}
