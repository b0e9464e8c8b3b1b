//! Pinning a mutation to the object the ownership check saw.
//!
//! In owned mode the proxy GETs an object, confirms the client owns it, then sends
//! the PUT, PATCH or DELETE. Between the two, the object's owner labels can be
//! changed, or the object deleted and recreated by someone else under the same
//! name. The mutation therefore carries preconditions the target enforces
//! atomically with the write, so it lands only on the state that was checked:
//!
//! - object bodies (PUT, merge/strategic patch, server-side apply): the checked
//!   `metadata.uid` and `metadata.resourceVersion` (a uid in a PUT is a precondition,
//!   a changed uid in a patch is refused as immutable, and a resourceVersion in
//!   either is an optimistic-concurrency precondition);
//! - JSON patch: leading `test` operations on the uid and on both owner labels, which
//!   the target evaluates against the object it writes;
//! - DELETE: `DeleteOptions.preconditions` with both uid and resourceVersion.
//!
//! Server-side apply of an object that did not exist at the check is pinned to a
//! resourceVersion no object has ([`NO_OBJECT_RESOURCE_VERSION`]): kube ignores an
//! apply's resourceVersion when the apply creates, so the apply still creates, but
//! an object created by someone else in between refuses it instead of being taken
//! over. Not a uid: kube refuses an apply that names a uid when no object exists.

use serde_json::{json, Map, Value};

use crate::ownership::{self, BodyType, Owner};
use crate::request::{self, encode_query_value, query_bool};
use crate::request_body::{CallerValue, ShapeError, WriteBody};

/// What the ownership check saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pin {
    pub uid: String,
    pub resource_version: String,
}

impl Pin {
    /// Reads the pin from a checked object; `None` without a uid or resourceVersion.
    pub fn of(object: &Value) -> Option<Pin> {
        let field = |name: &str| {
            object
                .get("metadata")
                .and_then(|m| m.get(name))
                .and_then(Value::as_str)
                .filter(|v| !v.is_empty())
                .map(str::to_string)
        };
        Some(Pin {
            uid: field("uid")?,
            resource_version: field("resourceVersion")?,
        })
    }
}

/// The body could not be amended with the precondition.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PreconditionError {
    /// The body is not of a shape that can carry the precondition.
    #[error("request body cannot carry a precondition: {0}")]
    Unparsable(String),
    /// The caller's own `metadata.resourceVersion` differs from the checked one: the
    /// write cannot be both what the caller asked and what was checked.
    #[error("the object has been modified; please apply your changes to the latest version and try again")]
    Stale,
    /// A replacement (PUT) without a resourceVersion of the caller's: kube
    /// refuses it for a custom resource (its strategy allows no unconditional
    /// update), where a pin would write over whatever state the check saw.
    #[error("metadata.resourceVersion must be specified for an update")]
    NoResourceVersion,
    /// A delete option in the query that kube could not read either.
    #[error("invalid delete option {name}={value:?}: {problem}")]
    DeleteOption {
        name: &'static str,
        value: String,
        problem: &'static str,
    },
}

/// Pins a PUT or PATCH body to the checked state of an owned object.
pub fn pin_write(owner: &Owner, body: &mut WriteBody, pin: &Pin) -> Result<(), PreconditionError> {
    if body.body_type == BodyType::JsonPatch {
        let mut tests = vec![json!({"op": "test", "path": "/metadata/uid", "value": pin.uid})];
        for (key, value) in ownership::owner_labels(owner) {
            tests
                .push(json!({"op": "test", "path": ownership::label_pointer(key), "value": value}));
        }
        return body.add_operations(tests, Vec::new()).map_err(unparsable);
    }
    let replacement = matches!(body.body_type, BodyType::Json | BodyType::Yaml);
    pin_metadata(body, pin, replacement)
}

/// Pins a PUT or PATCH of a subresource whose body is a view of the object, not
/// the object (an autoscaling `Scale`): it carries the object's uid and
/// resourceVersion but no labels. A JSON patch tests both, so that any change to
/// the object since the check (a label removed, a delete and create) refuses it.
pub fn pin_view_write(body: &mut WriteBody, pin: &Pin) -> Result<(), PreconditionError> {
    if body.body_type == BodyType::JsonPatch {
        let tests = vec![
            json!({"op": "test", "path": "/metadata/uid", "value": pin.uid}),
            json!({"op": "test", "path": "/metadata/resourceVersion", "value": pin.resource_version}),
        ];
        return body.add_operations(tests, Vec::new()).map_err(unparsable);
    }
    // A view is a replacement too, but kube writes a Scale without a
    // resourceVersion onto the object's current one.
    pin_metadata(body, pin, false)
}

/// Sets the checked uid and resourceVersion in a body's own metadata; a caller's
/// own different resourceVersion is a conflict. A `replacement` (a PUT of the
/// object) must name its resourceVersion, as kube requires of a custom resource
/// ("0" reads as none), unless it names another uid, which the target refuses
/// first, as kube checks the uid precondition first; a patch needs none.
///
/// A caller's own uid stays as sent: it is the caller's precondition (a PUT) or
/// a change kube refuses (a patch), and the target answers it as kube would.
/// Writing the checked uid over it would let a write meant for one incarnation
/// of the object land on the next. The checked resourceVersion alone holds the
/// write to the checked state, since no other state of any object has it.
fn pin_metadata(
    body: &mut WriteBody,
    pin: &Pin,
    replacement: bool,
) -> Result<(), PreconditionError> {
    let uid = callers_uid(body).map_err(unparsable)?;
    let needs_version = replacement && !is_another_uid(uid.as_ref(), pin);
    let names_uid = uid.is_some();
    match body.resource_version().map_err(unparsable)? {
        CallerValue::Missing if needs_version => return Err(PreconditionError::NoResourceVersion),
        CallerValue::Text(caller) if needs_version && (caller.is_empty() || caller == "0") => {
            return Err(PreconditionError::NoResourceVersion)
        }
        CallerValue::Missing => {}
        CallerValue::Text(caller) if caller.is_empty() || caller == pin.resource_version => {}
        CallerValue::Text(_) | CallerValue::Other => return Err(PreconditionError::Stale),
    }
    if !names_uid {
        body.set_metadata_field("uid", Some(&pin.uid))
            .map_err(unparsable)?;
    }
    body.set_metadata_field("resourceVersion", Some(&pin.resource_version))
        .map_err(unparsable)
}

/// Whether `body` carries a uid of the caller's own other than the pinned one.
/// The target refuses such a write because of that uid whatever else the pin
/// holds (a PUT's uid precondition fails, a patch may not change the uid), so
/// sending it pinned to that state only settles the wording of the refusal.
pub fn names_another_uid(body: &WriteBody, pin: &Pin) -> bool {
    callers_uid(body).is_ok_and(|uid| is_another_uid(uid.as_ref(), pin))
}

/// Whether a caller's uid ([`callers_uid`]) is other than the pinned one.
fn is_another_uid(uid: Option<&CallerValue<'_>>, pin: &Pin) -> bool {
    match uid {
        Some(CallerValue::Text(uid)) => *uid != pin.uid,
        Some(_) => true,
        None => false,
    }
}

/// The uid the caller's body names itself; `None` when it is absent, null or
/// empty (kube reads those as no uid).
fn callers_uid(body: &WriteBody) -> Result<Option<CallerValue<'_>>, ShapeError> {
    Ok(match body.uid()? {
        CallerValue::Missing => None,
        CallerValue::Text(uid) if uid.is_empty() => None,
        named => Some(named),
    })
}

/// The resourceVersion [`pin_apply_create`] sets: the largest one kube parses
/// (an unsigned 64-bit etcd revision), which no stored object reaches. Not "0",
/// which kube reads as no resourceVersion at all.
pub const NO_OBJECT_RESOURCE_VERSION: &str = "18446744073709551615";

/// Pins a server-side apply of an object that did not exist at the check, so that
/// it can only create (see the module documentation). kube's registry ignores an
/// apply's resourceVersion when there is no object (it creates one with its own)
/// and refuses one that differs from a stored object's with 409, so an object
/// someone else created in between refuses this apply. A resourceVersion the
/// caller sent is replaced: against a missing object kube ignores it anyway. A
/// uid the caller sent stays, and kube answers it as it would without the proxy
/// (409 "uid mismatch", since no object exists to carry it): see
/// [`names_a_uid`].
pub fn pin_apply_create(body: &mut WriteBody) -> Result<(), PreconditionError> {
    body.set_metadata_field("resourceVersion", Some(NO_OBJECT_RESOURCE_VERSION))
        .map_err(unparsable)
}

/// Pins an apply to the object with `uid`: kube applies it to that object only,
/// and refuses it (409, "uid mismatch") when no object exists, so it cannot
/// create one. For a body that names no uid of its own ([`names_a_uid`]).
pub fn pin_uid(body: &mut WriteBody, uid: &str) -> Result<(), PreconditionError> {
    body.set_metadata_field("uid", Some(uid))
        .map_err(unparsable)
}

/// Whether `body` names a uid of the caller's own. An apply that names one finds
/// only that object: with none there kube refuses it for the uid alone, however
/// it is pinned.
pub fn names_a_uid(body: &WriteBody) -> bool {
    matches!(callers_uid(body), Ok(Some(_)))
}

fn unparsable(error: ShapeError) -> PreconditionError {
    PreconditionError::Unparsable(error.to_string())
}

/// A DeleteOptions body carrying the caller's options plus the uid and
/// resourceVersion preconditions of `pin` (see [`DeleteOptions`]).
pub fn pin_delete(
    body: &[u8],
    query: Option<&str>,
    pin: &Pin,
) -> Result<Vec<u8>, PreconditionError> {
    DeleteOptions::read(body, query)?.pinned(pin)
}

/// A delete's options, read once and kept as text apart from their
/// preconditions.
///
/// A deletecollection sends them once per listed object, each time with that
/// object's pin. Kept as a tree, a 3 MiB body of small numbers would stay some
/// 50 MiB in memory for as long as the collection takes, and be copied whole
/// for every object; as text it is the size of the body, and a pinned body is
/// that text with the preconditions written in front. Every owned-mode DELETE
/// goes through here, so pinning is byte concatenation, and options taken from
/// the query (most deletes send none in a body) are written without building a
/// tree at all.
#[derive(Debug, Clone, PartialEq)]
pub struct DeleteOptions {
    /// The caller's own uid and resourceVersion preconditions, which every pin
    /// must meet.
    caller_uid: CallerPrecondition,
    caller_resource_version: CallerPrecondition,
    /// The caller's preconditions other than uid and resourceVersion (which the
    /// pin sets), and every other member: each written as a JSON member after
    /// a comma, to follow the pin's preconditions and their object.
    other_preconditions: Vec<u8>,
    members: Vec<u8>,
    /// Whether the options ask for a dry run.
    dry_run: bool,
    /// For options read from a short query (the caller sent no body, and at most
    /// [`MAX_QUERY_PIN_PAIRS`] other parameters): that query without its uid and
    /// resourceVersion parameters and the pairs Go drops, so that a named delete
    /// can be pinned in the query and go without a body, as it came.
    caller_query: Option<String>,
}

/// A mutation pinned to a checked state, as it goes to the target.
#[derive(Debug, Clone, PartialEq)]
pub enum PinnedRequest {
    /// With this body (the pinned document, or DeleteOptions), at the caller's
    /// path and query.
    Body(Vec<u8>),
    /// Without a body, with this query in place of the caller's: kube reads a
    /// delete's options from the query when the body is empty, its `uid` and
    /// `resourceVersion` parameters as preconditions (since 1.18), and the
    /// first value of a repeated parameter, which is the pin's here.
    Query(String),
}

impl DeleteOptions {
    /// The options of a delete: its body, or the options of its query when the
    /// body is empty.
    ///
    /// kube reads a delete's options from its body, and from the query only when
    /// the body is empty (curl, `kubectl --raw` and several clients send
    /// `?dryRun=All` or `?propagationPolicy=Orphan` that way). A pinned body is
    /// never empty, so for an empty caller body the options are taken from `query`
    /// into it ([`DeleteOptions::pinned`], which a deletecollection sends for each
    /// object): left in the query, a dry run would delete for real. A named
    /// delete keeps them in the query instead, with the pin
    /// ([`DeleteOptions::pinned_delete`]).
    pub fn read(body: &[u8], query: Option<&str>) -> Result<DeleteOptions, PreconditionError> {
        if body.iter().all(u8::is_ascii_whitespace) {
            let options = QueryDeleteOptions::read(query.unwrap_or(""))?;
            return Ok(DeleteOptions {
                caller_uid: CallerPrecondition::of_query(options.uid.as_deref()),
                caller_resource_version: CallerPrecondition::of_query(
                    options.resource_version.as_deref(),
                ),
                other_preconditions: Vec::new(),
                members: options.members()?,
                dry_run: !options.dry_run.is_empty(),
                caller_query: Some(without_preconditions(query.unwrap_or("")))
                    .filter(|rest| fits_a_query_pin(rest)),
            });
        }
        let options = crate::request_body::parse_json_strict(body)
            .map_err(|e| PreconditionError::Unparsable(e.to_string()))?;
        let Value::Object(mut members) = options else {
            return Err(PreconditionError::Unparsable(
                "DeleteOptions is not an object".into(),
            ));
        };
        let mut preconditions = match members.remove("preconditions") {
            None | Some(Value::Null) => Map::new(),
            Some(Value::Object(preconditions)) => preconditions,
            Some(_) => {
                return Err(PreconditionError::Unparsable(
                    "preconditions is not an object".into(),
                ))
            }
        };
        let dry_run = names_a_dry_run(members.get("dryRun"));
        let caller_uid = CallerPrecondition::of_body(preconditions.remove("uid"));
        let caller_resource_version =
            CallerPrecondition::of_body(preconditions.remove("resourceVersion"));
        Ok(DeleteOptions {
            caller_uid,
            caller_resource_version,
            other_preconditions: each_after_a_comma(&preconditions)?,
            members: each_after_a_comma(&members)?,
            dry_run,
            caller_query: None,
        })
    }

    /// Whether kube dry-runs a delete with these options: they list `dryRun`
    /// values (a query naming `dryRun` at all, or a body's non-empty `dryRun`).
    /// A value other than `All` makes kube refuse the delete, so a delete that
    /// succeeds with such options was a dry run.
    pub fn is_dry_run(&self) -> bool {
        self.dry_run
    }

    /// The options as the body sent, with the uid and resourceVersion
    /// preconditions of `pin`. A caller uid or resourceVersion precondition that
    /// the checked state does not meet is [`PreconditionError::Stale`]: kube
    /// would answer it with a conflict.
    pub fn pinned(&self, pin: &Pin) -> Result<Vec<u8>, PreconditionError> {
        self.met_by(pin)?;
        let mut body = Vec::with_capacity(
            self.other_preconditions.len()
                + self.members.len()
                + pin.uid.len()
                + pin.resource_version.len()
                + 64,
        );
        body.extend_from_slice(br#"{"preconditions":{"uid":"#);
        write_json(&mut body, &pin.uid)?;
        write_member_after_a_comma(&mut body, "resourceVersion", &pin.resource_version)?;
        body.extend_from_slice(&self.other_preconditions);
        body.push(b'}');
        body.extend_from_slice(&self.members);
        body.push(b'}');
        Ok(body)
    }

    /// A named delete pinned to `pin` in the form the caller sent its options:
    /// a body when it sent one, the query when it did not and its query is
    /// short (see [`MAX_QUERY_PIN_PAIRS`]). Sent without a body, a delete the
    /// caller sent without one costs the target no body to read. Caller
    /// preconditions are checked as by [`DeleteOptions::pinned`].
    pub fn pinned_delete(&self, pin: &Pin) -> Result<PinnedRequest, PreconditionError> {
        let Some(rest) = &self.caller_query else {
            return self.pinned(pin).map(PinnedRequest::Body);
        };
        self.met_by(pin)?;
        let mut query = format!(
            "uid={}&resourceVersion={}",
            encode_query_value(&pin.uid),
            encode_query_value(&pin.resource_version)
        );
        if !rest.is_empty() {
            query.push('&');
            query.push_str(rest);
        }
        Ok(PinnedRequest::Query(query))
    }

    /// [`PreconditionError::Stale`] unless `pin` meets the caller's own uid and
    /// resourceVersion preconditions: kube would answer the delete with a
    /// conflict.
    fn met_by(&self, pin: &Pin) -> Result<(), PreconditionError> {
        if self.caller_uid.met_by(&pin.uid)
            && self.caller_resource_version.met_by(&pin.resource_version)
        {
            Ok(())
        } else {
            Err(PreconditionError::Stale)
        }
    }
}

/// Most parameters of the caller's (besides its uid and resourceVersion) that a
/// delete pinned in its query keeps; a longer query is pinned in a body.
///
/// The pin in the query holds only while the target reads the query at all. Go
/// (1.24.12 and 1.25.6 on, GODEBUG `urlmaxqueryparams`, 10 000 unless an
/// operator lowers it) drops a query of too many parameters whole, and kube
/// ignores the error: a caller's padding would leave the delete unpinned. kube
/// reads a body's preconditions whatever the query, so only a query of a few
/// parameters carries a pin: six at most with the pin's two, fewer than the
/// list requests kubectl itself sends, which a target with a lower limit could
/// not serve.
pub const MAX_QUERY_PIN_PAIRS: usize = 4;
/// Most bytes of the caller's query that a delete pinned in its query keeps.
pub const MAX_QUERY_PIN_BYTES: usize = 1024;

/// Whether the caller's query (without its uid and resourceVersion, and without
/// the pairs Go drops) is short enough to carry the pin, see [`MAX_QUERY_PIN_PAIRS`].
fn fits_a_query_pin(rest: &str) -> bool {
    rest.len() <= MAX_QUERY_PIN_BYTES
        && (rest.is_empty()
            || rest.bytes().filter(|&byte| byte == b'&').count() < MAX_QUERY_PIN_PAIRS)
}

/// `query` without the parameters Go's parser would read as `uid` or
/// `resourceVersion`, and without the pairs it drops (which the target would
/// drop too); every other pair stays as it was written. (The pin's parameters go
/// first in any case, and kube reads a parameter's first value, so a pair this
/// misses could not override them either.)
fn without_preconditions(query: &str) -> String {
    request::retain_query(query, |name| !matches!(name, "uid" | "resourceVersion"))
}

/// A body's `dryRun`: an empty list or `null` asks for none; anything else is a
/// dry run or makes kube refuse the delete.
fn names_a_dry_run(value: Option<&Value>) -> bool {
    match value {
        None | Some(Value::Null) => false,
        Some(Value::Array(values)) => !values.is_empty(),
        Some(_) => true,
    }
}

/// The members of `object`, each written as `,"key":value`.
fn each_after_a_comma(object: &Map<String, Value>) -> Result<Vec<u8>, PreconditionError> {
    let mut text = Vec::new();
    for (key, value) in object {
        write_member_after_a_comma(&mut text, key, value)?;
    }
    Ok(text)
}

/// Appends `,"key":value` to `out`.
fn write_member_after_a_comma(
    out: &mut Vec<u8>,
    key: &str,
    value: &(impl serde::Serialize + ?Sized),
) -> Result<(), PreconditionError> {
    out.push(b',');
    write_json(out, key)?;
    out.push(b':');
    write_json(out, value)
}

/// Appends `value` to `out` as JSON.
fn write_json(
    out: &mut Vec<u8>,
    value: &(impl serde::Serialize + ?Sized),
) -> Result<(), PreconditionError> {
    serde_json::to_writer(out, value).map_err(|e| PreconditionError::Unparsable(e.to_string()))
}

/// What a caller's own precondition on one field asks of every pin. Kept as
/// this, not as the value it was read from: a deletecollection holds its
/// options for as long as it takes, and a precondition can be any JSON.
#[derive(Debug, Clone, PartialEq)]
enum CallerPrecondition {
    /// None was given: every pin meets it.
    Absent,
    /// The pinned value must be this one.
    Equal(String),
    /// Not text, so no object's uid or resourceVersion equals it.
    Unmeetable,
}

impl CallerPrecondition {
    /// A precondition of a body's `preconditions`; `null` is none.
    fn of_body(value: Option<Value>) -> Self {
        match value {
            None | Some(Value::Null) => CallerPrecondition::Absent,
            Some(Value::String(text)) => CallerPrecondition::Equal(text),
            Some(_) => CallerPrecondition::Unmeetable,
        }
    }

    /// A precondition of a query (its first value); kube ignores an empty one.
    fn of_query(value: Option<&str>) -> Self {
        match value {
            Some(text) if !text.is_empty() => CallerPrecondition::Equal(text.to_string()),
            _ => CallerPrecondition::Absent,
        }
    }

    fn met_by(&self, pinned: &str) -> bool {
        match self {
            CallerPrecondition::Absent => true,
            CallerPrecondition::Equal(text) => text == pinned,
            CallerPrecondition::Unmeetable => false,
        }
    }
}

/// The DeleteOptions kube reads from a query, as its parameter codec does:
/// `dryRun` takes every value, the other options their first; a boolean is
/// false only for `0` or `false` (any case); a number is a base-10 int64;
/// `uid` and `resourceVersion` are preconditions. Other parameters are not
/// read.
#[derive(Debug, Default)]
struct QueryDeleteOptions {
    /// The first value of each precondition parameter, perhaps empty.
    uid: Option<String>,
    resource_version: Option<String>,
    dry_run: Vec<String>,
    propagation_policy: Option<String>,
    grace_period_seconds: Option<i64>,
    orphan_dependents: Option<bool>,
    ignore_store_read_error: Option<bool>,
}

impl QueryDeleteOptions {
    fn read(query: &str) -> Result<Self, PreconditionError> {
        let mut options = QueryDeleteOptions::default();
        for (name, value) in request::query_pairs(Some(query)) {
            match name.as_str() {
                "dryRun" => options.dry_run.push(value),
                "uid" => {
                    options.uid.get_or_insert(value);
                }
                "resourceVersion" => {
                    options.resource_version.get_or_insert(value);
                }
                "propagationPolicy" => {
                    options.propagation_policy.get_or_insert(value);
                }
                "gracePeriodSeconds" if options.grace_period_seconds.is_none() => {
                    let seconds =
                        value
                            .parse::<i64>()
                            .map_err(|_| PreconditionError::DeleteOption {
                                name: "gracePeriodSeconds",
                                value: value.clone(),
                                problem: "not a base-10 64-bit integer",
                            })?;
                    options.grace_period_seconds = Some(seconds);
                }
                "orphanDependents" => {
                    options.orphan_dependents.get_or_insert(query_bool(&value));
                }
                "ignoreStoreReadErrorWithClusterBreakingPotential" => {
                    options
                        .ignore_store_read_error
                        .get_or_insert(query_bool(&value));
                }
                _ => {}
            }
        }
        Ok(options)
    }

    /// The options as members of a DeleteOptions, each after a comma.
    fn members(&self) -> Result<Vec<u8>, PreconditionError> {
        let mut text = br#","kind":"DeleteOptions","apiVersion":"v1""#.to_vec();
        if !self.dry_run.is_empty() {
            write_member_after_a_comma(&mut text, "dryRun", &self.dry_run)?;
        }
        if let Some(policy) = &self.propagation_policy {
            write_member_after_a_comma(&mut text, "propagationPolicy", policy)?;
        }
        if let Some(seconds) = &self.grace_period_seconds {
            write_member_after_a_comma(&mut text, "gracePeriodSeconds", seconds)?;
        }
        if let Some(orphan) = &self.orphan_dependents {
            write_member_after_a_comma(&mut text, "orphanDependents", orphan)?;
        }
        if let Some(ignore) = &self.ignore_store_read_error {
            let key = "ignoreStoreReadErrorWithClusterBreakingPotential";
            write_member_after_a_comma(&mut text, key, ignore)?;
        }
        Ok(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owner() -> Owner {
        Owner::new("client", "proj")
    }

    fn pin() -> Pin {
        Pin {
            uid: "u1".into(),
            resource_version: "7".into(),
        }
    }

    fn body(ct: &str, text: &str) -> WriteBody {
        WriteBody::parse(Some(ct), text.as_bytes()).expect("parses")
    }

    fn parsed(bytes: Vec<u8>) -> Value {
        serde_json::from_slice(&bytes).expect("json")
    }

    #[test]
    fn pin_is_read_from_the_checked_object() {
        let object = json!({"metadata": {"uid": "u1", "resourceVersion": "7"}});
        assert_eq!(Pin::of(&object), Some(pin()));
        assert_eq!(Pin::of(&json!({"metadata": {"uid": "u1"}})), None);
    }

    #[test]
    fn json_patch_gets_leading_tests_on_uid_and_owner_labels() {
        let mut b = body(
            "application/json-patch+json",
            r#"[{"op":"replace","path":"/spec/a","value":1}]"#,
        );
        pin_write(&owner(), &mut b, &pin()).expect("pin");
        assert_eq!(
            b.document().expect("strict JSON"),
            json!([
                {"op":"test","path":"/metadata/uid","value":"u1"},
                {"op":"test","path":"/metadata/labels/vcluster.com~1owner-vcluster","value":"client"},
                {"op":"test","path":"/metadata/labels/vcluster.com~1owner-project","value":"proj"},
                {"op":"replace","path":"/spec/a","value":1}
            ])
        );
    }

    #[test]
    fn a_view_of_the_object_is_pinned_by_uid_and_resource_version_only() {
        let mut b = body(
            "application/json-patch+json",
            r#"[{"op":"replace","path":"/spec/replicas","value":3}]"#,
        );
        pin_view_write(&mut b, &pin()).expect("pin");
        assert_eq!(
            b.document().expect("strict JSON"),
            json!([
                {"op":"test","path":"/metadata/uid","value":"u1"},
                {"op":"test","path":"/metadata/resourceVersion","value":"7"},
                {"op":"replace","path":"/spec/replicas","value":3}
            ])
        );
        let mut b = body(
            "application/json",
            r#"{"kind":"Scale","spec":{"replicas":3}}"#,
        );
        pin_view_write(&mut b, &pin()).expect("pin");
        assert_eq!(
            b.document().expect("strict JSON"),
            json!({"kind":"Scale","spec":{"replicas":3},"metadata":{"uid":"u1","resourceVersion":"7"}})
        );
        let mut b = body(
            "application/json",
            r#"{"metadata":{"resourceVersion":"6"}}"#,
        );
        assert_eq!(
            pin_view_write(&mut b, &pin()),
            Err(PreconditionError::Stale)
        );
    }

    #[test]
    fn a_callers_uid_other_than_the_pinned_one_is_named() {
        let named = |ct: &str, sent: &str| names_another_uid(&body(ct, sent), &pin());
        for ct in [
            "application/json",
            "application/merge-patch+json",
            "application/apply-patch+yaml",
        ] {
            assert!(
                named(ct, r#"{"metadata":{"uid":"an-earlier-incarnation"}}"#),
                "{ct}"
            );
            assert!(named(ct, r#"{"metadata":{"uid":7}}"#), "{ct}");
            for same_or_none in [
                r#"{"metadata":{"uid":"u1"}}"#,
                r#"{"metadata":{"uid":""}}"#,
                r#"{"metadata":{"uid":null}}"#,
                r#"{"metadata":{"name":"a"}}"#,
                r#"{"spec":{"uid":"elsewhere"}}"#,
            ] {
                assert!(!named(ct, same_or_none), "{ct}: {same_or_none}");
            }
        }
        // A JSON patch's own tests are the target's to evaluate.
        let ops = r#"[{"op":"test","path":"/metadata/uid","value":"other"}]"#;
        assert!(!named("application/json-patch+json", ops));
    }

    #[test]
    fn a_replacement_without_a_resource_version_is_refused() {
        for ct in ["application/json", "application/yaml"] {
            for sent in [
                r#"{"metadata":{"name":"a"}}"#,
                r#"{"metadata":{"name":"a","resourceVersion":""}}"#,
                r#"{"metadata":{"name":"a","resourceVersion":"0"}}"#,
            ] {
                assert_eq!(
                    pin_write(&owner(), &mut body(ct, sent), &pin()),
                    Err(PreconditionError::NoResourceVersion),
                    "{ct}: {sent}"
                );
            }
            // Another incarnation's uid: the target refuses it for the uid (409).
            let mut b = body(ct, r#"{"metadata":{"name":"a","uid":"u0"}}"#);
            pin_write(&owner(), &mut b, &pin()).expect("pin");
            let mut b = body(ct, r#"{"metadata":{"name":"a","resourceVersion":"7"}}"#);
            pin_write(&owner(), &mut b, &pin()).expect("pin");
            assert_eq!(
                b.document().expect("strict JSON"),
                json!({"metadata":{"name":"a","resourceVersion":"7","uid":"u1"}}),
                "{ct}"
            );
        }
    }

    #[test]
    fn object_bodies_get_the_checked_resource_version_and_keep_the_callers_uid() {
        // A replacement names its own resourceVersion (see the test above).
        for ct in [
            "application/merge-patch+json",
            "application/strategic-merge-patch+json",
            "application/apply-patch+yaml",
        ] {
            // Without a uid of its own the body takes the checked one.
            for sent in [
                r#"{"metadata":{"name":"a"}}"#,
                r#"{"metadata":{"name":"a","uid":null}}"#,
                r#"{"metadata":{"name":"a","uid":""}}"#,
            ] {
                let mut b = body(ct, sent);
                pin_write(&owner(), &mut b, &pin()).expect("pin");
                assert_eq!(
                    b.document().expect("strict JSON"),
                    json!({"metadata":{"name":"a","uid":"u1","resourceVersion":"7"}}),
                    "{ct}: {sent}"
                );
            }
            // The caller's own uid, the checked one or another incarnation's (the
            // target refuses that write, as kube would), is left as sent.
            for uid in [json!("u1"), json!("an-earlier-incarnation"), json!(7)] {
                let sent = json!({"metadata": {"uid": uid, "name": "a"}}).to_string();
                let mut b = body(ct, &sent);
                pin_write(&owner(), &mut b, &pin()).expect("pin");
                assert_eq!(
                    b.document().expect("strict JSON"),
                    json!({"metadata":{"uid":uid,"name":"a","resourceVersion":"7"}}),
                    "{ct}: {sent}"
                );
            }
        }
        let mut b = body(
            "application/merge-patch+json",
            r#"{"metadata":null,"spec":{}}"#,
        );
        pin_write(&owner(), &mut b, &pin()).expect("pin");
        assert_eq!(
            b.document().expect("strict JSON"),
            json!({"metadata":{"uid":"u1","resourceVersion":"7"},"spec":{}})
        );
    }

    #[test]
    fn a_caller_resource_version_other_than_the_checked_one_is_stale() {
        let mut b = body(
            "application/json",
            r#"{"metadata":{"resourceVersion":"7"}}"#,
        );
        assert!(pin_write(&owner(), &mut b, &pin()).is_ok());
        let mut b = body(
            "application/json",
            r#"{"metadata":{"resourceVersion":"8"}}"#,
        );
        assert_eq!(
            pin_write(&owner(), &mut b, &pin()),
            Err(PreconditionError::Stale)
        );
        assert_eq!(
            pin_delete(
                br#"{"preconditions":{"resourceVersion":"6"}}"#,
                None,
                &pin()
            ),
            Err(PreconditionError::Stale)
        );
    }

    #[test]
    fn apply_that_may_create_is_pinned_to_a_resource_version_no_object_has() {
        let mut b = body(
            "application/apply-patch+yaml",
            "metadata:\n  name: a\n  resourceVersion: \"3\"\n",
        );
        pin_apply_create(&mut b).expect("pin");
        assert_eq!(
            b.document().expect("strict JSON"),
            json!({"metadata":{"name":"a","resourceVersion":"18446744073709551615"}})
        );
        assert!(!names_a_uid(&b));
        // No uid is added (kube would refuse it for want of an object); the
        // caller's own stays, for kube to answer.
        let mut b = body(
            "application/apply-patch+yaml",
            "metadata:\n  name: a\n  uid: mine\n",
        );
        pin_apply_create(&mut b).expect("pin");
        assert_eq!(
            b.document().expect("strict JSON"),
            json!({"metadata":{"name":"a","uid":"mine","resourceVersion":"18446744073709551615"}})
        );
        assert!(names_a_uid(&b));
        // kube parses it as an unsigned 64-bit revision; "0" would mean none.
        assert_eq!(NO_OBJECT_RESOURCE_VERSION.parse::<u64>(), Ok(u64::MAX));
    }

    #[test]
    fn delete_options_keep_the_callers_fields() {
        let out = pin_delete(
            br#"{"propagationPolicy":"Foreground","preconditions":{"resourceVersion":"7"}}"#,
            Some("propagationPolicy=Orphan&dryRun=All"),
            &pin(),
        )
        .expect("pin");
        assert_eq!(
            parsed(out),
            json!({"propagationPolicy":"Foreground","preconditions":{"resourceVersion":"7","uid":"u1"}})
        );
        let empty = parsed(pin_delete(b"", None, &pin()).expect("pin"));
        assert_eq!(
            empty["preconditions"],
            json!({"uid":"u1","resourceVersion":"7"})
        );
    }

    #[test]
    fn a_delete_is_a_dry_run_as_kube_reads_its_options() {
        // kube reads the body's options, and the query's only when the body is
        // empty (kubectl's `--dry-run=server` sends them in the body).
        for (body, query, dry_run) in [
            (r#"{"dryRun":["All"]}"#, None, true),
            (
                r#"{"kind":"DeleteOptions","apiVersion":"v1","dryRun":["All"]}"#,
                None,
                true,
            ),
            (r#"{"dryRun":[]}"#, None, false),
            (r#"{"dryRun":null}"#, None, false),
            (r#"{"propagationPolicy":"Background"}"#, None, false),
            (r#"{}"#, Some("dryRun=All"), false),
            ("", Some("dryRun=All"), true),
            ("", Some("propagationPolicy=Orphan"), false),
            ("", None, false),
        ] {
            let options = DeleteOptions::read(body.as_bytes(), query).expect("options");
            assert_eq!(options.is_dry_run(), dry_run, "{body:?} {query:?}");
        }
    }

    #[test]
    fn an_empty_body_takes_the_delete_options_of_the_query() {
        // The target would ignore them in the query once the body is not empty.
        let query = "dryRun=All&propagationPolicy=Orphan&gracePeriodSeconds=%2B0&orphanDependents=FALSE&pretty=true&dryRun=x&propagationPolicy=Foreground";
        let out = parsed(pin_delete(b" ", Some(query), &pin()).expect("pin"));
        assert_eq!(
            out,
            json!({"kind": "DeleteOptions", "apiVersion": "v1",
                   "dryRun": ["All", "x"], "propagationPolicy": "Orphan",
                   "gracePeriodSeconds": 0, "orphanDependents": false,
                   "preconditions": {"uid": "u1", "resourceVersion": "7"}})
        );
        for (query, expected) in [
            ("orphanDependents=", true),
            ("orphanDependents=0", false),
            ("orphanDependents=yes", true),
        ] {
            let out = parsed(pin_delete(b"", Some(query), &pin()).expect("pin"));
            assert_eq!(out["orphanDependents"], expected, "{query}");
        }
        let out = parsed(pin_delete(b"", Some("gracePeriodSeconds=-30"), &pin()).expect("pin"));
        assert_eq!(out["gracePeriodSeconds"], -30);
        // Like every option but dryRun, kube reads the first value only.
        let query =
            "gracePeriodSeconds=5&gracePeriodSeconds=x&orphanDependents=0&orphanDependents=1";
        let out = parsed(pin_delete(b"", Some(query), &pin()).expect("pin"));
        assert_eq!(out["gracePeriodSeconds"], 5);
        assert_eq!(out["orphanDependents"], false);
        // kube reads a query's uid and resourceVersion as preconditions (the
        // first of each, unless empty).
        let out = parsed(pin_delete(b"", Some("resourceVersion=7&uid=u1"), &pin()).expect("pin"));
        assert_eq!(
            out["preconditions"],
            json!({"uid": "u1", "resourceVersion": "7"})
        );
        assert!(out.get("uid").is_none() && out.get("resourceVersion").is_none());
        for stale in ["resourceVersion=6", "uid=u2", "uid=u1&resourceVersion=7%20"] {
            assert_eq!(
                pin_delete(b"", Some(stale), &pin()),
                Err(PreconditionError::Stale),
                "{stale}"
            );
        }
        for met in [
            "resourceVersion=&resourceVersion=6",
            "uid=",
            "resourceVersion=7&resourceVersion=6",
        ] {
            assert!(pin_delete(b"", Some(met), &pin()).is_ok(), "{met}");
        }
        // No options at all: a DeleteOptions of the preconditions alone.
        assert_eq!(
            parsed(pin_delete(b"", Some("pretty=true"), &pin()).expect("pin")),
            json!({"kind": "DeleteOptions", "apiVersion": "v1",
                   "preconditions": {"uid": "u1", "resourceVersion": "7"}})
        );
        // Pairs Go's query parser drops (a `;`, a malformed escape) are not read.
        let query =
            "propagationPolicy=%zz&dryRun=All;x&propagationPolicy=%4Frphan&gracePeriodSeconds=%+1";
        let out = parsed(pin_delete(b"", Some(query), &pin()).expect("pin"));
        assert_eq!(out["propagationPolicy"], "Orphan");
        assert!(out.get("dryRun").is_none(), "{out}");
        assert!(out.get("gracePeriodSeconds").is_none(), "{out}");
        for bad in [
            "gracePeriodSeconds=",
            "gracePeriodSeconds=1.5",
            "gracePeriodSeconds=99999999999999999999",
            "gracePeriodSeconds=%2B-1",
        ] {
            assert!(
                matches!(
                    pin_delete(b"", Some(bad), &pin()),
                    Err(PreconditionError::DeleteOption {
                        name: "gracePeriodSeconds",
                        ..
                    })
                ),
                "{bad}"
            );
        }
    }

    #[test]
    fn a_delete_sent_without_a_body_is_pinned_in_its_query() {
        let pinned = |body: &[u8], query: Option<&str>| {
            DeleteOptions::read(body, query)
                .expect("options")
                .pinned_delete(&pin())
        };
        let query = |text: &str| Ok(PinnedRequest::Query(text.to_string()));
        // The pin's parameters first, the caller's others as it wrote them.
        assert_eq!(pinned(b"", None), query("uid=u1&resourceVersion=7"));
        assert_eq!(
            pinned(b" \n", Some("dryRun=All&propagationPolicy=Orphan")),
            query("uid=u1&resourceVersion=7&dryRun=All&propagationPolicy=Orphan")
        );
        // The caller's own uid and resourceVersion, met by the pin, give way to
        // it however they were spelled; empty pairs go too.
        assert_eq!(
            pinned(
                b"",
                Some("&%75id=u1&pretty=1&&resourceVersion=&resourceVersion=6&")
            ),
            query("uid=u1&resourceVersion=7&pretty=1")
        );
        // Pairs Go drops (a `;`, a malformed escape) are not sent on: the target
        // would drop them too, and they do not count towards the query's size.
        assert_eq!(
            pinned(
                b"",
                Some("pretty=1&a=1;b=2&uid%zz=u2&propagationPolicy=Orphan&;&;&;&;&;")
            ),
            query("uid=u1&resourceVersion=7&pretty=1&propagationPolicy=Orphan")
        );
        assert_eq!(
            pinned(b"", Some("uid=u2")),
            Err(PreconditionError::Stale),
            "a caller precondition the pin does not meet"
        );
        // A pin is escaped, and reads back as itself.
        let odd = Pin {
            uid: "a b&uid=c%".into(),
            resource_version: "1+2".into(),
        };
        let Ok(PinnedRequest::Query(text)) = DeleteOptions::read(b"", None)
            .expect("options")
            .pinned_delete(&odd)
        else {
            panic!("a query");
        };
        assert_eq!(text, "uid=a%20b%26uid%3Dc%25&resourceVersion=1%2B2");
        let read_back = DeleteOptions::read(b"", Some(&text)).expect("options");
        assert!(read_back.pinned(&odd).is_ok());
        assert_eq!(read_back.pinned(&pin()), Err(PreconditionError::Stale));
        // A long query goes the body's way: padded past Go's parameter limit,
        // it would be dropped whole, the pin with it.
        let pairs = |n: usize| vec!["pretty=1"; n].join("&");
        assert!(matches!(
            pinned(b"", Some(&pairs(MAX_QUERY_PIN_PAIRS))),
            Ok(PinnedRequest::Query(_))
        ));
        for long in [
            pairs(MAX_QUERY_PIN_PAIRS + 1),
            pairs(9_999),
            format!("pretty={}", "1".repeat(MAX_QUERY_PIN_BYTES)),
        ] {
            let options = DeleteOptions::read(b"", Some(&long)).expect("options");
            assert_eq!(
                options.pinned_delete(&pin()),
                options.pinned(&pin()).map(PinnedRequest::Body),
                "{} bytes",
                long.len()
            );
        }
        // A caller that sent a body has the pin in the body, as before.
        let body = br#"{"propagationPolicy":"Orphan"}"#;
        let options = DeleteOptions::read(body, Some("dryRun=All")).expect("options");
        assert_eq!(
            options.pinned_delete(&pin()),
            options.pinned(&pin()).map(PinnedRequest::Body)
        );
    }

    #[test]
    fn delete_options_read_once_pin_each_object_apart() {
        let options = DeleteOptions::read(
            br#"{"kind":"DeleteOptions","preconditions":null,"dryRun":["All"],"note":"\u00e9"}"#,
            None,
        )
        .expect("options");
        let other = Pin {
            uid: "u2".into(),
            resource_version: "9".into(),
        };
        assert_eq!(
            parsed(options.pinned(&pin()).expect("pin")),
            json!({"kind":"DeleteOptions","dryRun":["All"],"note":"\u{e9}",
                   "preconditions":{"uid":"u1","resourceVersion":"7"}})
        );
        assert_eq!(
            parsed(options.pinned(&other).expect("pin"))["preconditions"],
            json!({"uid":"u2","resourceVersion":"9"})
        );
        // A caller's resourceVersion precondition holds for one object only.
        let options = DeleteOptions::read(br#"{"preconditions":{"resourceVersion":"7"}}"#, None)
            .expect("options");
        assert!(options.pinned(&pin()).is_ok());
        assert_eq!(options.pinned(&other), Err(PreconditionError::Stale));
        // Nothing but preconditions: no stray comma.
        let options = DeleteOptions::read(br#"{"preconditions":{}}"#, None).expect("options");
        assert_eq!(
            parsed(options.pinned(&pin()).expect("pin")),
            json!({"preconditions":{"uid":"u1","resourceVersion":"7"}})
        );
        // A caller's uid precondition holds like its resourceVersion;
        // preconditions kube does not know are passed on for it to judge.
        let options = DeleteOptions::read(
            br#"{"preconditions":{"uid":"u1","x":[1],"resourceVersion":null}}"#,
            None,
        )
        .expect("options");
        assert_eq!(
            parsed(options.pinned(&pin()).expect("pin")),
            json!({"preconditions":{"uid":"u1","x":[1],"resourceVersion":"7"}})
        );
        assert_eq!(options.pinned(&other), Err(PreconditionError::Stale));
        for body in [
            &br#"{"preconditions":{"uid":"evil"}}"#[..],
            br#"{"preconditions":{"uid":7}}"#,
            br#"{"preconditions":{"resourceVersion":["7"]}}"#,
        ] {
            let options = DeleteOptions::read(body, None).expect("options");
            assert_eq!(options.pinned(&pin()), Err(PreconditionError::Stale));
        }
    }

    #[test]
    fn delete_preconditions_that_are_not_an_object_are_refused() {
        for body in [&br#"{"preconditions":[]}"#[..], br#"{"preconditions":"x"}"#] {
            assert!(
                matches!(
                    DeleteOptions::read(body, None),
                    Err(PreconditionError::Unparsable(_))
                ),
                "{}",
                String::from_utf8_lossy(body)
            );
        }
    }

    #[test]
    fn garbage_is_refused() {
        let mut b = body("application/json", "[1]");
        assert!(pin_write(&owner(), &mut b, &pin()).is_err());
        assert!(pin_delete(b"[1]", None, &pin()).is_err());
        assert!(pin_delete(br#"{"a":1,"a":2}"#, None, &pin()).is_err());
    }
}
