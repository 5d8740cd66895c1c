//! The vocabulary of admission rules: one violation of a field ([`FieldError`], as Kubernetes'
//! field.Error prints it) and the outcome of checking one object ([`ValidationOutcome`]).

use std::fmt;

/// What kind of problem a field has, mirroring Kubernetes' field.ErrorType.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FieldErrorKind {
    /// The field is missing or empty.
    Required,
    /// The value is malformed or out of range.
    Invalid(String),
    /// The value is well-formed but not one of the supported ones.
    Unsupported(String),
    /// The change or the value is not allowed.
    Forbidden,
}

/// One violation of the rules, with its field path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldError {
    /// Dotted path such as `spec.version`.
    pub path: String,
    /// Category of the violation.
    pub kind: FieldErrorKind,
    /// Human explanation of the rule.
    pub detail: String,
}

impl FieldError {
    /// An Invalid error of `path` holding `value`.
    pub fn invalid(path: &str, value: impl fmt::Display, detail: impl Into<String>) -> Self {
        Self { path: path.into(), kind: FieldErrorKind::Invalid(value.to_string()), detail: detail.into() }
    }

    /// A short machine-friendly reason, used as a metrics label.
    pub fn reason(&self) -> &'static str {
        match self.kind {
            FieldErrorKind::Required => "FieldValueRequired",
            FieldErrorKind::Invalid(_) => "FieldValueInvalid",
            FieldErrorKind::Unsupported(_) => "FieldValueNotSupported",
            FieldErrorKind::Forbidden => "FieldValueForbidden",
        }
    }
}

impl fmt::Display for FieldError {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            FieldErrorKind::Required => write!(formatter, "{}: Required value", self.path)?,
            FieldErrorKind::Invalid(value) => write!(formatter, "{}: Invalid value: {value:?}", self.path)?,
            FieldErrorKind::Unsupported(value) => write!(formatter, "{}: Unsupported value: {value:?}", self.path)?,
            FieldErrorKind::Forbidden => write!(formatter, "{}: Forbidden", self.path)?,
        }
        if !self.detail.is_empty() {
            write!(formatter, ": {}", self.detail)?;
        }
        Ok(())
    }
}

/// All violations and warnings of one object.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ValidationOutcome {
    /// Violations: any one of them denies admission.
    pub errors: Vec<FieldError>,
    /// Things the user should know that do not block admission.
    pub warnings: Vec<String>,
}

impl ValidationOutcome {
    /// True when there is no violation.
    pub fn is_allowed(&self) -> bool {
        self.errors.is_empty()
    }

    /// All violations joined in one message, as Kubernetes does for field error lists.
    pub fn message(&self) -> String {
        let errors: Vec<String> = self.errors.iter().map(ToString::to_string).collect();
        errors.join(", ")
    }
}
