//! Log capture for the proxy's integration tests: what one thread logged, as
//! formatted text and as structured events.
//!
//! One subscriber serves the whole test binary, installed as the global default on
//! first use, and each event goes to the capture of the thread it happens on (or
//! nowhere). A subscriber per test (`set_default`) is not reliable while tests run
//! in parallel: tracing caches whether anyone listens at each log call site, and a
//! test without a subscriber reaching a call site first can leave it "nobody
//! listens" for the others. Run a capturing test on a current-thread runtime: the
//! code under test then runs on that thread too.
#![allow(dead_code)]

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, Once};

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};

/// One event: its level, its message, and its other fields as text (strings
/// without quotes).
#[derive(Clone, Debug)]
pub struct Line {
    pub level: Level,
    pub message: String,
    pub fields: BTreeMap<String, String>,
}

/// The events of the thread that called [`LogBuffer::capture`], kept in memory.
#[derive(Clone, Default)]
pub struct LogBuffer {
    text: Arc<Mutex<Vec<u8>>>,
    lines: Arc<Mutex<Vec<Line>>>,
}

thread_local! {
    static CAPTURING: RefCell<Option<LogBuffer>> = const { RefCell::new(None) };
}

/// The capture of the current thread, if it has one.
fn capturing() -> Option<LogBuffer> {
    CAPTURING.with(|capturing| capturing.borrow().clone())
}

/// Ends a capture when dropped.
pub struct CaptureGuard(());

impl Drop for CaptureGuard {
    fn drop(&mut self) {
        CAPTURING.with(|capturing| capturing.borrow_mut().take());
    }
}

impl LogBuffer {
    /// Captures this thread's events until the guard is dropped.
    pub fn capture() -> (LogBuffer, CaptureGuard) {
        static INSTALLED: Once = Once::new();
        INSTALLED.call_once(|| {
            // INFO and up, the formatter's default: the debug events of every
            // crate below would only slow the tests.
            let subscriber = tracing_subscriber::registry()
                .with(LevelFilter::INFO)
                .with(
                    tracing_subscriber::fmt::layer()
                        .with_writer(ThreadWriter)
                        .with_ansi(false),
                )
                .with(ThreadLines);
            tracing::subscriber::set_global_default(subscriber)
                .expect("no other global subscriber in this test binary");
        });
        let logs = LogBuffer::default();
        CAPTURING.with(|capturing| *capturing.borrow_mut() = Some(logs.clone()));
        (logs, CaptureGuard(()))
    }

    /// Everything captured so far, formatted as the proxy's plain log output.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.text.lock().expect("log")).into_owned()
    }

    /// The captured events whose message contains `fragment`, in order.
    pub fn with_message(&self, fragment: &str) -> Vec<Line> {
        self.lines
            .lock()
            .expect("log")
            .iter()
            .filter(|line| line.message.contains(fragment))
            .cloned()
            .collect()
    }
}

/// Writes each formatted event into the capture of the thread it happens on, or
/// nowhere.
struct ThreadWriter;

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for ThreadWriter {
    type Writer = Box<dyn std::io::Write>;
    fn make_writer(&'a self) -> Self::Writer {
        match capturing() {
            Some(logs) => Box::new(TextWriter(logs.text)),
            None => Box::new(std::io::sink()),
        }
    }
}

struct TextWriter(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for TextWriter {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("log").extend_from_slice(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Records each event, structured, into the capture of the thread it happens on.
struct ThreadLines;

impl<S: Subscriber> Layer<S> for ThreadLines {
    fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
        let Some(logs) = capturing() else { return };
        let mut fields = Fields(BTreeMap::new());
        event.record(&mut fields);
        let message = fields.0.remove("message").unwrap_or_default();
        logs.lines.lock().expect("log").push(Line {
            level: *event.metadata().level(),
            message,
            fields: fields.0,
        });
    }
}

struct Fields(BTreeMap<String, String>);

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(
            field.name().to_owned(),
            format!("{value:?}").trim_matches('"').to_owned(),
        );
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
}
