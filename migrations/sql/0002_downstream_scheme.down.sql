-- Without the column every key derives its downstream idempotency keys from
-- request_id again. A key in flight created under version 2 (scheme 2) would
-- then send its provider a key other than the one its earlier attempt sent,
-- and a provider that already acted on the first would act again (a second
-- charge): refuse while any unfinished key uses scheme 2. Let them finish
-- (or reconcile them) first. SQLSTATE IDEM1 is idem's refusal
-- (migrations.ErrRefused).
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM {{schema}}idem_keys WHERE status <> 'finished' AND downstream_scheme <> 1) THEN
        RAISE EXCEPTION 'idem: unfinished keys derive their downstream idempotency keys from the request (downstream_scheme 2); reverting 0002 would change the keys their retries send to providers: let them finish, or reconcile them, first'
            USING ERRCODE = 'IDEM1';
    END IF;
END
$$;
ALTER TABLE {{schema}}idem_keys DROP COLUMN downstream_scheme;
