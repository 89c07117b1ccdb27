-- Dropping the table forgets every verdict: export it first if it must be
-- kept (see docs/operations.md, "Verdicts").
DROP TABLE {{schema}}idem_verdicts;
