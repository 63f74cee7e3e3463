//! The file being checked, for errors about the values read from it.

use std::net::SocketAddr;
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

impl Ctx<'_> {
    /// An optional `IP:port` to listen on (`[metrics] listen` in both
    /// daemons): `None` when absent, else the address, or an error naming
    /// `field`. A name is refused: what a listener binds to must not
    /// depend on name resolution at start.
    pub fn listen_addr(
        &self,
        value: &Option<Spanned<String>>,
        field: &str,
    ) -> Result<Option<SocketAddr>, ConfigError> {
        let Some(v) = value else {
            return Ok(None);
        };
        v.get_ref().parse::<SocketAddr>().map(Some).map_err(|_| {
            self.err(
                v,
                field,
                format!(
                    "`{}` is not an IP:port address (e.g. \"127.0.0.1:9750\" or \"[::1]:9750\")",
                    v.get_ref()
                ),
            )
        })
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
    fn listen_addresses_are_ip_and_port() {
        let src = "[metrics]\nlisten = \"localhost:9750\"\n";
        #[derive(Deserialize)]
        struct M {
            metrics: L,
        }
        #[derive(Deserialize)]
        struct L {
            listen: Option<Spanned<String>>,
        }
        let raw: M = toml::from_str(src).unwrap();
        let cx = Ctx {
            file: Path::new("t.toml"),
            source: src,
        };
        let e = cx
            .listen_addr(&raw.metrics.listen, "metrics.listen")
            .unwrap_err();
        assert!(
            e.to_string()
                .starts_with("t.toml:2:10: field `metrics.listen`: `localhost:9750` is not"),
            "{e}"
        );
        assert_eq!(cx.listen_addr(&None, "metrics.listen"), Ok(None));
        let ok = Some(Spanned::new(0..0, "[::1]:9750".to_owned()));
        assert_eq!(
            cx.listen_addr(&ok, "metrics.listen"),
            Ok(Some("[::1]:9750".parse().unwrap()))
        );
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
