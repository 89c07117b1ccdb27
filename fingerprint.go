package idem

import (
	"crypto/hmac"
	"crypto/sha256"
	"errors"
)

// MinFingerprintKeyLength is the shortest key FingerprintHMAC (and
// Config.FingerprintKey) accepts: 32 bytes, as much as the hash.
const MinFingerprintKeyLength = 32

// FingerprintHMAC is Fingerprint keyed with a server secret: HMAC-SHA-256
// with key over the same bytes (the flow name, 0x00, the canonical JSON of
// params). A stored fingerprint of a low-entropy input (a card number, a
// phone number) can be inverted by trying every value, which takes minutes
// for an unkeyed hash; without the key it cannot be. Config.FingerprintKey
// makes the runner use it. key must be at least MinFingerprintKeyLength
// bytes.
func FingerprintHMAC(key []byte, flow string, params []byte) ([]byte, error) {
	if len(key) < MinFingerprintKeyLength {
		return nil, errors.New("idem: a fingerprint key must be at least 32 bytes")
	}
	return fingerprintWith(key, flow, params)
}

// fingerprintWith is FingerprintHMAC with key, or Fingerprint without one.
func fingerprintWith(key []byte, flow string, params []byte) ([]byte, error) {
	if len(key) == 0 {
		return Fingerprint(flow, params)
	}
	c := canonGet(params)
	defer canonPut(c)
	c.out = append(c.out, flow...)
	c.out = append(c.out, 0)
	if err := c.canonicalize(); err != nil {
		return nil, err
	}
	mac := hmac.New(sha256.New, key)
	mac.Write(c.out)
	return mac.Sum(nil), nil
}

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
