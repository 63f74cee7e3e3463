//! The file being checked, for errors about the values read from it.

use std::ops::RangeInclusive;
use std::path::Path;

use toml::Spanned;

use crate::ConfigError;

/// A configuration file under check: where it was read from and its text,
/// into which the spans of `toml::Spanned` values point.
///
/// Parse the raw form with `toml` (keeping `Spanned` the values a later
/// check may reject), then build the checked form, rejecting values with
/// [`Ctx::err`].
#[derive(Debug, Clone, Copy)]
pub struct Ctx<'a> {
    /// The file the text was read from (named in every error).
    pub file: &'a Path,
    /// The file's text.
    pub source: &'a str,
}

impl Ctx<'_> {
    /// An error rejecting `value`, the value of `field`, with `message`.
    ///
    /// `field` is the field's dotted name (`io.queues`,
    /// `subsystem.namespace.size`). The error points at the value's line
    /// and column and names its key, the last part of `field`, under the
    /// `[table]` or `[[array]]` header the value sits below in the source
    /// (so the name follows how the file is written). A value that is not
    /// in the file (an empty span: a default) gets an error about the
    /// whole file naming `field` as given.
    pub fn err<T>(
        &self,
        value: &Spanned<T>,
        field: &str,
        message: impl Into<String>,
    ) -> ConfigError {
        let span = value.span();
        if span.start == span.end {
            let mut e = ConfigError::whole_file(self.file, message);
            e.field = field.to_owned();
            return e;
        }
        let key = field.rsplit('.').next().unwrap_or(field);
        ConfigError::at_span(self.file, self.source, span, Some(key), message)
    }

    /// An optional integer setting: `default` when absent, else its value
    /// if within `range`, else an error naming `field` (see [`Ctx::err`])
    /// and the range.
    pub fn int(
        &self,
        value: &Option<Spanned<i64>>,
        field: &str,
        default: i64,
        range: RangeInclusive<i64>,
    ) -> Result<i64, ConfigError> {
        match value {
            None => Ok(default),
            Some(s) if range.contains(s.get_ref()) => Ok(*s.get_ref()),
            Some(s) => Err(self.err(
                s,
                field,
                format!(
                    "{} is out of range ({}..={})",
                    s.get_ref(),
                    range.start(),
                    range.end()
                ),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;

    use super::*;

    #[derive(Deserialize)]
    struct Raw {
        io: Io,
    }

    #[derive(Deserialize)]
    struct Io {
        queues: Option<Spanned<i64>>,
        #[serde(default = "default_depth")]
        depth: Spanned<i64>,
    }

    fn default_depth() -> Spanned<i64> {
        Spanned::new(0..0, 64)
    }

    const SOURCE: &str = "name = \"v\"\n[io]\nqueues = 99\n";

    fn check(f: impl FnOnce(&Ctx<'_>, &Io)) {
        let raw: Raw = toml::from_str(SOURCE).unwrap();
        let cx = Ctx {
            file: Path::new("v.toml"),
            source: SOURCE,
        };
        f(&cx, &raw.io)
    }

    #[test]
    fn errors_name_the_key_under_its_table() {
        check(|cx, io| {
            let e = cx.err(io.queues.as_ref().unwrap(), "io.queues", "too many");
            assert_eq!(e.to_string(), "v.toml:3:10: field `io.queues`: too many");
        });
    }

    #[test]
    fn a_value_not_in_the_file_is_a_whole_file_error() {
        check(|cx, io| {
            let e = cx.err(&io.depth, "io.depth", "missing");
            assert_eq!((e.line, e.field.as_str()), (0, "io.depth"));
            assert_eq!(e.to_string(), "v.toml: field `io.depth`: missing");
        });
    }

    #[test]
    fn integers_default_and_are_range_checked() {
        check(|cx, io| {
            assert_eq!(cx.int(&None, "io.queues", 4, 1..=64), Ok(4));
            assert_eq!(cx.int(&io.queues, "io.queues", 4, 1..=100), Ok(99));
            let e = cx.int(&io.queues, "io.queues", 4, 1..=64).unwrap_err();
            assert_eq!(e.message, "99 is out of range (1..=64)");
            assert_eq!((e.line, e.field.as_str()), (3, "io.queues"));
        });
    }
}
