package idem

import (
	"crypto/hmac"
	"crypto/sha256"
	"errors"
	"fmt"
	"sync"

	"github.com/go-idem/idem/internal/canonical"
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
	buf, err := canonical.Append(append([]byte(flow), 0), params)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidParams, err)
	}
	mac := hmac.New(sha256.New, key)
	mac.Write(buf)
	return mac.Sum(nil), nil
}

// Fingerprint identifies a request by what it asks for, so that a key reused
// for a different request is caught (and answered 422) instead of replaying a
// response that belongs to another payload. It is SHA-256 over the flow name,
// a 0x00 separator, and the canonical JSON of params (RFC 8785 style, with
// numbers kept exact): key order, whitespace, escapes and the spelling of
// numbers do not change it, any change of value does.
//
// The encoding is unambiguous even for a flow name that contains 0x00,
// because canonical JSON never contains a 0x00 byte: the last 0x00 of the
// hashed bytes is always the separator.
//
// An error wraps ErrInvalidParams and means params is not one JSON value in
// valid UTF-8, or is one with duplicate member names, unpaired escaped
// surrogates, nesting deeper than 512 or a number whose exponent exceeds
// ±1,000,000; the message says what is wrong and at which byte offset.
func Fingerprint(flow string, params []byte) ([]byte, error) {
	bufp := fingerprintBuffers.Get().(*[]byte) //nolint:forcetypeassert // the pool only holds *[]byte
	defer func() {
		if cap(*bufp) <= fingerprintMaxBuffer {
			fingerprintBuffers.Put(bufp)
		}
	}()

	// Canonicalise straight after the prefix in the pooled buffer, so the
	// canonical bytes are never copied and the hash needs no streaming state.
	buf := append((*bufp)[:0], flow...)
	buf = append(buf, 0)
	buf, err := canonical.Append(buf, params)
	*bufp = buf
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidParams, err)
	}
	sum := sha256.Sum256(buf)
	return sum[:], nil
}

// fingerprintMaxBuffer is the largest buffer returned to the pool, so that
// one huge request does not pin its memory for the life of the process.
const fingerprintMaxBuffer = 1 << 20

var fingerprintBuffers = sync.Pool{New: func() any { return new([]byte) }}
