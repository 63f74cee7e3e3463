//! Configuration errors that name the file, the line and the field.
//!
//! Both binaries read TOML; an operator who gets an error must be able to go
//! straight to the offending line. A parse error from `toml` carries a byte
//! span; semantic checks done after parsing carry the span of the value they
//! reject (via `toml::Spanned`). Either way the span is turned into a line,
//! a column and the dotted name of the field there.

use std::fmt;
use std::ops::Range;
use std::path::{Path, PathBuf};

/// A configuration error located in its source file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// The file the configuration was read from.
    pub file: PathBuf,
    /// 1-based line of the offending value, 0 when the error concerns the
    /// file as a whole (e.g. it cannot be read).
    pub line: usize,
    /// 1-based column of the offending value, 0 when unknown.
    pub column: usize,
    /// Dotted name of the field (`subsystem.namespace.size`), empty when the
    /// error is not about one field.
    pub field: String,
    /// What is wrong, and where it helps, what would be right.
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file.display())?;
        if self.line > 0 {
            write!(f, ":{}:{}", self.line, self.column)?;
        }
        if !self.field.is_empty() {
            write!(f, ": field `{}`", self.field)?;
        }
        write!(f, ": {}", self.message)
    }
}

impl std::error::Error for ConfigError {}

impl ConfigError {
    /// An error about the whole file (unreadable, empty where content is
    /// required).
    pub fn whole_file(file: &Path, message: impl Into<String>) -> Self {
        ConfigError {
            file: file.to_path_buf(),
            line: 0,
            column: 0,
            field: String::new(),
            message: message.into(),
        }
    }

    /// An error at `span` (byte offsets into `source`). The field name is
    /// derived from the source text: the key on that line, prefixed by the
    /// enclosing `[table]` header. `field_hint` overrides the key when the
    /// caller knows it better.
    pub fn at_span(
        file: &Path,
        source: &str,
        span: Range<usize>,
        field_hint: Option<&str>,
        message: impl Into<String>,
    ) -> Self {
        let (line, column) = line_column(source, span.start);
        let field = field_at(source, span.start, field_hint);
        ConfigError {
            file: file.to_path_buf(),
            line,
            column,
            field,
            message: message.into(),
        }
    }

    /// Converts a `toml` deserialization error.
    pub fn from_toml(file: &Path, source: &str, err: &toml::de::Error) -> Self {
        let message = err.message().trim().to_string();
        match err.span() {
            Some(span) => {
                // For "missing field `x`" the span covers the table; name the
                // missing field itself.
                let missing = backticked(&message, "missing field");
                let mut e = ConfigError::at_span(file, source, span, None, message.clone());
                if let Some(m) = missing {
                    // The span is the table missing the field: its header
                    // line counts.
                    let table = table_at(source, e_line_offset(source, e.line + 1));
                    e.field = join_field(&table, &m);
                } else if let Some(unknown) = backticked(&message, "unknown field") {
                    let table = table_at(source, e_line_offset(source, e.line));
                    e.field = join_field(&table, &unknown);
                }
                e
            }
            None => ConfigError::whole_file(file, message),
        }
    }
}

/// 1-based line and column of byte `offset` in `source`.
pub fn line_column(source: &str, offset: usize) -> (usize, usize) {
    let offset = offset.min(source.len());
    let before = &source[..floor_char_boundary(source, offset)];
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, column)
}

fn floor_char_boundary(s: &str, mut i: usize) -> usize {
    while i > 0 && !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

fn e_line_offset(source: &str, line: usize) -> usize {
    source
        .split_inclusive('\n')
        .take(line.saturating_sub(1))
        .map(str::len)
        .sum()
}

/// The text between backticks after `prefix` in a toml error message.
fn backticked(message: &str, prefix: &str) -> Option<String> {
    let rest = &message[message.find(prefix)? + prefix.len()..];
    let start = rest.find('`')? + 1;
    let end = start + rest[start..].find('`')?;
    Some(rest[start..end].to_string())
}

/// The dotted name of the `[table]` or `[[array]]` header governing `offset`.
fn table_at(source: &str, offset: usize) -> String {
    let offset = floor_char_boundary(source, offset.min(source.len()));
    let mut table = String::new();
    for line in source[..offset].lines() {
        let t = line.trim();
        if let Some(inner) = t
            .strip_prefix("[[")
            .and_then(|r| r.split("]]").next())
            .or_else(|| t.strip_prefix('[').and_then(|r| r.split(']').next()))
        {
            table = inner.trim().to_string();
        }
    }
    table
}

fn join_field(table: &str, key: &str) -> String {
    if table.is_empty() {
        key.to_string()
    } else {
        format!("{table}.{key}")
    }
}

/// The dotted field name at `offset`: the enclosing table plus the key of
/// the `key = value` line containing `offset`.
fn field_at(source: &str, offset: usize, hint: Option<&str>) -> String {
    let offset = floor_char_boundary(source, offset.min(source.len()));
    let line_start = source[..offset].rfind('\n').map_or(0, |i| i + 1);
    let table = table_at(source, line_start);
    if let Some(h) = hint {
        return join_field(&table, h);
    }
    let line = source[line_start..].lines().next().unwrap_or("");
    match line.split_once('=') {
        Some((key, _)) if !line.trim_start().starts_with('[') => {
            join_field(&table, key.trim().trim_matches('"'))
        }
        _ => table,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_and_column_are_one_based() {
        let src = "a = 1\nbb = 2\n";
        assert_eq!(line_column(src, 0), (1, 1));
        assert_eq!(line_column(src, 6), (2, 1));
        assert_eq!(line_column(src, 11), (2, 6));
    }

    #[test]
    fn field_names_include_the_table() {
        let src = "[[subsystem]]\nnqn = \"x\"\n[[subsystem.namespace]]\nsize = \"lots\"\n";
        let off = src.find("\"lots\"").unwrap();
        assert_eq!(field_at(src, off, None), "subsystem.namespace.size");
        let e = ConfigError::at_span(Path::new("t.toml"), src, off..off + 6, None, "bad size");
        assert_eq!(
            e.to_string(),
            "t.toml:4:8: field `subsystem.namespace.size`: bad size"
        );
    }
}
