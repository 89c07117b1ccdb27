-- Dropping the table would forget every operator's verdict, which idem
-- keeps for good: refuse while any is recorded (SQLSTATE IDEM1,
-- migrations.ErrRefused). Export them, delete them, then revert.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM {{schema}}idem_verdicts) THEN
        RAISE EXCEPTION 'idem: idem_verdicts holds operators'' verdicts, kept for good; reverting 0012 would drop them: export them and delete them first'
            USING ERRCODE = 'IDEM1';
    END IF;
END
$$;
DROP TABLE {{schema}}idem_verdicts;
