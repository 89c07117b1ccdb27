-- idem:floor 11 (it only adds a table; every statement of the previous
--   release stays as it was).
-- idem_verdicts records every operator verdict on a key (idem.Runner.Resolve,
-- `idem keys resolve`): who gave it (the --operator named, and the database
-- role and client address of the session that wrote it), why, on which key,
-- generation and fence, on which phase and its kind of foreign call, and the
-- answer given. A row is inserted in the transaction that applies the
-- verdict, so there is none for a verdict that did not land, and one for
-- every verdict that did.
--
-- It names its key by value (scope, key, key_id, generation), not by a
-- foreign key to idem_keys: a verdict must outlive its key, whose row the
-- commit that finishes it, and then the reaper, make forget it. The reaper
-- never deletes a verdict; nothing in idem updates or deletes one (see
-- docs/operations.md, "Verdicts", for their retention). Of the answer a
-- verdict finished its key with, only the status and the body's length are
-- kept: the record lives far longer than the key, and a body (or a hash of
-- it, which a guess can be checked against) may hold what the key's
-- retention exists to forget.
--
-- The primary key leads with the scope so that the table can be distributed
-- by it, co-located with idem_keys (Citus layout): the verdict's insert then
-- runs on the shard of the key's own row, in the same transaction.
CREATE TABLE {{schema}}idem_verdicts (
    id              bigint      GENERATED ALWAYS AS IDENTITY,
    scope           text        NOT NULL,
    key             text        NOT NULL,
    key_id          bigint      NOT NULL,
    generation      int         NOT NULL,
    fence           bigint      NOT NULL,
    flow            text        NOT NULL,
    verdict         text        NOT NULL CHECK (verdict IN ('happened', 'not_happened', 'abandon')),
    phase           text        NOT NULL,
    foreign_kind    text        NOT NULL,
    recovery_point  text        NOT NULL,
    operator        text        NOT NULL CHECK (operator <> ''),
    reason          text        NOT NULL CHECK (reason <> ''),
    action          text        NOT NULL,
    answer_status   int,
    answer_bytes    int,
    session_user_name text      NOT NULL DEFAULT session_user,
    client_addr     inet                 DEFAULT inet_client_addr(),
    created_at      timestamptz NOT NULL,
    PRIMARY KEY (scope, id)
);

-- keys show reads a key's verdicts, newest first; pruning by age scans
-- created_at.
CREATE INDEX idem_verdicts_key_idx ON {{schema}}idem_verdicts (scope, key, id);
CREATE INDEX idem_verdicts_created_at_idx ON {{schema}}idem_verdicts (created_at);
