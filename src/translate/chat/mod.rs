//! Chat-format translation (see the parent module).
