package idem

// sealer is what a store that seals at rest says of itself
// (pgstore.Store.Sealed).
type sealer interface{ Sealed() bool }

// warnUnkeyedFingerprints warns, once per runner, when the store seals what
// it keeps at rest and no FingerprintKeys are set: each key's fingerprints are
// then plain SHA-256 over what the client sent, stored beside the sealed
// params, and a guess at a small payload (an amount, a card number) can be
// checked against them, in the table or a dump of it. It warns rather than
// refuses: setting a key changes every new fingerprint, so a deployment must
// switch with care (Config.FingerprintKeys' AcceptUnkeyed), not because a
// release started refusing it.
func (r *Runner) warnUnkeyedFingerprints() {
	if s, ok := r.store.(sealer); !ok || !s.Sealed() || r.config.FingerprintKeys != nil {
		return
	}
	r.log.Warn("idem: the store seals params and responses at rest, but fingerprints are unkeyed (no Config.FingerprintKeys): " +
		"a fingerprint is SHA-256 over what the client sent, and a guessed payload can be checked against it; set FingerprintKeys " +
		"(with AcceptUnkeyed while keys made before remain; see docs/operations.md, Data and retention)")
}
