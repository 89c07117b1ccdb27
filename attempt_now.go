package idem

import "time"

// Now is the runner's clock: time.Now in production, Config.Test.Now when a
// test sets it. Read the time a phase decides with here rather than with
// time.Now, so that a test moving the clock between phases (the crash kit's
// late_retry scenarios) reaches the phase; and read it once: a date a later
// phase needs belongs in the row or checkpoint the first phase wrote, since
// after a crash the later phase may run a day later.
func (r *Attempt[In]) Now() time.Time { return r.h.runner.localNow() }
