//! A blocking client of the arbiter (placeholder, replaced below).
