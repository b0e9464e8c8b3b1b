//! `x-kubernetes-validations`: CEL rules attached to CRD schema nodes.
//!
//! Each rule sees `self` (the node's value) and, for transition rules, `oldSelf`
//! (the value before an update). A rule that does not hold becomes a field error
//! whose value is the node's type name (`Invalid value: "object": <message>`),
//! as kube-apiserver 1.32 reports it.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use cel::objects::{Key, Map as CelMap};
use cel::{Context, Env, Program, Value as CelValue};
use serde_json::Value;

use super::SchemaError;

fn env() -> Arc<Env> {
    static ENV: OnceLock<Arc<Env>> = OnceLock::new();
    ENV.get_or_init(|| {
        let mut env = Env::stdlib();
        // kube's CRD environment includes the strings, lists and math
        // libraries; a failure to register one only narrows what rules can use.
        let _ = env.add_extension(cel::extensions::strings);
        let _ = env.add_extension(cel::extensions::lists);
        let _ = env.add_extension(cel::extensions::math);
        Arc::new(env)
    })
    .clone()
}

/// One compiled rule.
#[derive(Debug)]
pub(super) struct Rule {
    /// The source, for `failed rule: <rule>` messages.
    pub(super) rule: String,
    program: Program,
    message: Option<String>,
    message_expression: Option<Program>,
    /// Where the error is reported, relative to the node (`.spec.replicas`).
    pub(super) field_path: Option<String>,
    /// `FieldValueInvalid` (default), `FieldValueForbidden`,
    /// `FieldValueRequired` or `FieldValueDuplicate`.
    pub(super) reason: Option<String>,
    /// Whether the rule reads `oldSelf` (it then only runs on updates).
    pub(super) transition: bool,
}

/// The outcome of a rule that did not pass.
pub(super) enum Failure {
    /// The rule evaluated to false; the detail is its message.
    False(String),
    /// The rule could not be evaluated.
    Error(String),
}

fn compile(source: &str) -> Result<Program, String> {
    let env = env();
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        env.compile(source).map_err(|e| e.to_string())
    }))
    .unwrap_or_else(|_| Err("the rule could not be compiled".to_string()))
}

impl Rule {
    /// Compiles the `x-kubernetes-validations` list of a schema node.
    pub(super) fn parse_all(rules: Option<&Value>, path: &str) -> Result<Vec<Rule>, SchemaError> {
        let Some(list) = rules else {
            return Ok(Vec::new());
        };
        let bad = |what: &str| SchemaError::BadKeyword {
            path: path.into(),
            keyword: format!("x-kubernetes-validations{what}"),
        };
        let list = list.as_array().ok_or_else(|| bad(""))?;
        let mut out = Vec::new();
        for (i, r) in list.iter().enumerate() {
            let text = |k: &str| r.get(k).and_then(Value::as_str).map(str::to_string);
            let rule = text("rule").ok_or_else(|| bad(&format!("[{i}].rule")))?;
            let program = compile(&rule).map_err(|message| SchemaError::BadRule {
                path: path.into(),
                rule: rule.clone(),
                message,
            })?;
            let message_expression = match text("messageExpression") {
                Some(expr) => Some(compile(&expr).map_err(|message| SchemaError::BadRule {
                    path: path.into(),
                    rule: expr.clone(),
                    message,
                })?),
                None => None,
            };
            let transition = program.references().has_variable("oldSelf");
            out.push(Rule {
                rule,
                program,
                message: text("message"),
                message_expression,
                field_path: text("fieldPath").filter(|p| !p.trim().is_empty()),
                reason: text("reason"),
                transition,
            });
        }
        Ok(out)
    }

    /// Evaluates the rule; `Ok(())` when it holds.
    pub(super) fn check(&self, value: &Value, old: Option<&Value>) -> Result<(), Failure> {
        // The CEL crate is young and the values come from clients: a panic
        // anywhere in building the activation or evaluating becomes an
        // evaluation error instead of a failed request.
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            self.check_inner(value, old)
        }))
        .unwrap_or_else(|_| {
            Err(Failure::Error(format!(
                "internal error evaluating rule: {}",
                self.rule.trim()
            )))
        })
    }

    fn check_inner(&self, value: &Value, old: Option<&Value>) -> Result<(), Failure> {
        let env = env();
        let mut ctx = Context::with_env(env);
        ctx.add_variable_from_value("self", to_cel(value));
        if let Some(o) = old {
            ctx.add_variable_from_value("oldSelf", to_cel(o));
        }
        let run = |p: &Program| {
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| p.execute(&ctx)))
                .map_err(|_| "internal error".to_string())
                .and_then(|r| r.map_err(|e| e.to_string()))
        };
        match run(&self.program) {
            Ok(CelValue::Bool(true)) => Ok(()),
            Ok(CelValue::Bool(false)) => {
                let from_expression = self.message_expression.as_ref().and_then(|p| match run(p) {
                    Ok(CelValue::String(s)) if !s.trim().is_empty() => Some(s.to_string()),
                    _ => None,
                });
                let detail = from_expression
                    .or_else(|| {
                        self.message
                            .as_deref()
                            .map(str::trim)
                            .filter(|m| !m.is_empty())
                            .map(str::to_string)
                    })
                    .unwrap_or_else(|| format!("failed rule: {}", self.rule.trim()));
                Err(Failure::False(detail))
            }
            Ok(other) => Err(Failure::Error(format!(
                "rule evaluated to {other:?}, not a bool, evaluating rule: {}",
                self.rule.trim()
            ))),
            Err(e) => Err(Failure::Error(format!(
                "{e} evaluating rule: {}",
                self.rule.trim()
            ))),
        }
    }
}

/// A JSON value as CEL sees it. Null members of objects are left out: kube
/// treats them as absent, so `has(self.x)` is false for `x: null`.
fn to_cel(v: &Value) -> CelValue {
    match v {
        Value::Null => CelValue::Null,
        Value::Bool(b) => CelValue::Bool(*b),
        Value::Number(n) => match (n.as_i64(), n.as_u64(), n.as_f64()) {
            (Some(i), _, _) => CelValue::Int(i),
            (None, Some(u), _) => CelValue::UInt(u),
            (_, _, Some(f)) => CelValue::Float(f),
            _ => CelValue::Null,
        },
        Value::String(s) => CelValue::String(Arc::new(s.clone())),
        Value::Array(items) => CelValue::List(Arc::new(items.iter().map(to_cel).collect())),
        Value::Object(map) => {
            let converted: HashMap<Key, CelValue> = map
                .iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (Key::from(k.as_str()), to_cel(v)))
                .collect();
            CelValue::Map(CelMap::from(converted))
        }
    }
}
