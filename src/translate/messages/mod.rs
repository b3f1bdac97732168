//! Messages-format translation (see the parent module).
