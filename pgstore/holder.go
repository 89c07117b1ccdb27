package pgstore

import (
	"crypto/rand"
	"encoding/hex"
	"os"

	"github.com/go-idem/idem/idemtype"
)

// bootID tells this process from every other, including earlier and later
// processes of the same instance: a lease held by another boot of this
// store's instance is a dead process's (see Config.Instance). It is one per
// process, not per Store, so two stores of one process never take each
// other's leases.
var bootID = randomHex()

// randomHex is 16 random hex digits: a boot id, a probe's statement name.
func randomHex() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b) // never fails (crypto/rand panics rather)
	return hex.EncodeToString(b)
}

// holder is who a store's leases name as their holder (the lease row's
// holder_* columns, KeyRecord.Holder*).
type holder struct {
	instance, host string
	pid            int
	boot           string
}

func newHolder(instance string) holder {
	host, _ := os.Hostname()
	return holder{instance: instance, host: host, pid: os.Getpid(), boot: bootID}
}

// args are the holder's statement parameters, in the order the statements
// take them: instance, host, pid, boot.
func (h holder) args() []any { return []any{h.instance, h.host, h.pid, h.boot} }

// resumes reports whether rec's lease was taken by an earlier process of this
// store's instance, which a takeover may end before it expires.
func (h holder) resumes(rec *idemtype.KeyRecord) bool {
	return h.instance != "" && rec.HolderInstance == h.instance && rec.HolderBoot != h.boot
}
