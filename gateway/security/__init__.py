"""Authentication, authorization and rate limits (docs/security.md)."""
