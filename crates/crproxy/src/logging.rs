//! Log output of the `crproxy` command: one JSON object per line (the default,
//! what log pipelines parse) or human-readable lines (`--human-logs`).
//!
//! The JSON lines are written by [`JsonLines`] rather than tracing-subscriber's
//! JSON formatter because that one always names the event's module path
//! `target`, and the spec's log entries carry a `target` field of their own (the
//! target cluster, e.g. on the quarantine line): a line with the key twice keeps
//! only one of them in most log tools. Here the module path is `logger`.

use std::fmt;
use std::io::IsTerminal;

use serde_json::{Map, Value};
use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

/// The key the event's module path is written under.
pub const LOGGER_KEY: &str = "logger";

/// Installs the process-wide subscriber. The level filter comes from
/// `CRPROXY_LOG` (tracing's env-filter syntax), `info` by default.
/// Human-readable lines are coloured only on a terminal without `NO_COLOR`.
pub fn init(human: bool) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("CRPROXY_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if human {
        // Colour codes only help a terminal; in a file or a pipe they are noise.
        // NO_COLOR (https://no-color.org) turns them off on a terminal too.
        let colour = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
        builder.with_ansi(colour).init();
    } else {
        builder.event_format(JsonLines).init();
    }
}

/// One JSON object per event: `timestamp`, `level`, `message`, the event's
/// fields as they are named, and `logger` (the module path).
#[derive(Clone, Copy, Debug, Default)]
pub struct JsonLines;

impl<S, N> FormatEvent<S, N> for JsonLines
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        _ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        writeln!(writer, "{}", json_line(event))
    }
}

/// The JSON object [`JsonLines`] writes for `event`.
pub fn json_line(event: &Event<'_>) -> Value {
    let metadata = event.metadata();
    let mut fields = JsonFields(Map::new());
    event.record(&mut fields);
    let mut line = Map::new();
    line.insert(
        "timestamp".into(),
        Value::String(chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true)),
    );
    line.insert("level".into(), Value::String(metadata.level().to_string()));
    if let Some(message) = fields.0.remove("message") {
        line.insert("message".into(), message);
    }
    for (key, value) in fields.0 {
        // The three keys above belong to the line; a field cannot replace them.
        line.entry(key).or_insert(value);
    }
    line.entry(LOGGER_KEY)
        .or_insert_with(|| Value::String(metadata.target().to_string()));
    Value::Object(line)
}

/// Collects an event's fields, keeping numbers and booleans typed.
struct JsonFields(Map<String, Value>);

impl Visit for JsonFields {
    fn record_f64(&mut self, field: &Field, value: f64) {
        let value = serde_json::Number::from_f64(value)
            .map(Value::Number)
            .unwrap_or_else(|| Value::String(value.to_string()));
        self.0.insert(field.name().into(), value);
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.0.insert(field.name().into(), Value::from(value));
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.insert(field.name().into(), Value::from(value));
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.0.insert(field.name().into(), Value::Bool(value));
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.0
            .insert(field.name().into(), Value::String(value.into()));
    }

    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.0
            .insert(field.name().into(), Value::String(value.to_string()));
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.0
            .insert(field.name().into(), Value::String(format!("{value:?}")));
    }
}

#[cfg(test)]
mod tests;
