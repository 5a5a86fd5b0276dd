"""The contract's evolution rules: tolerant readers, schema compatibility, CloudEvents headers."""
