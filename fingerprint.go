package idem

import "crypto/sha256"

// Fingerprint identifies a request by what it asks for, so that a key reused
// for a different request is caught (and answered 422) instead of replaying a
// response that belongs to another payload. It is SHA-256 over the flow name,
// a 0x00 separator, and CanonicalJSON(params): key order, whitespace, escapes
// and the spelling of numbers do not change it, any change of value does.
//
// The encoding is unambiguous even for a flow name that contains 0x00,
// because canonical JSON never contains a 0x00 byte: the last 0x00 of the
// hashed bytes is always the separator.
//
// An error wraps ErrInvalidJSON and means params is not a JSON document
// CanonicalJSON accepts.
func Fingerprint(flow string, params []byte) ([]byte, error) {
	c := canonGet(params)
	defer canonPut(c)

	// Canonicalise straight after the prefix in the pooled buffer, so the
	// canonical bytes are never copied and the hash needs no streaming state.
	c.out = append(c.out, flow...)
	c.out = append(c.out, 0)
	if err := c.canonicalize(); err != nil {
		return nil, err
	}
	sum := sha256.Sum256(c.out)
	return sum[:], nil
}
