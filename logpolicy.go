package idem

import "github.com/go-idem/idem/idemtype"

// LogAttrs returns the attributes of a log line about the key (scope, key)
// under the runner's Config.LogKeys policy: the key's row id (key_id) when
// rec is known, its scope and key only with LogKeys, then attrs. The
// adapters (idemhttp, idemgrpc) log their own lines about a key through it,
// so that no line names a client's key or scope (a tenant, a Connect
// account) unless the operator asked for it.
func (r *Runner) LogAttrs(scope, key string, rec *idemtype.KeyRecord, attrs ...any) []any {
	var id int64
	if rec != nil {
		id = rec.ID
	}
	return r.logAttrs(scope, key, id, attrs...)
}

// LogError returns err as a log line about the key (scope, key) shows it:
// with the text Config.RedactError gives it and, unless Config.LogKeys,
// with the scope's and the key's text replaced (the runner's errors name a
// key as `key "..."` or `scope "..." key "..."`). It still wraps err.
func (r *Runner) LogError(err error, scope, key string) error { return r.logErr(err, scope, key) }
