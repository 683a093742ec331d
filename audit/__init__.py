"""The audit trail: one queryable log of every operator action (who, what, target, when, outcome)."""
