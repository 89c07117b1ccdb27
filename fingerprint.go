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

// FingerprintHMAC is Fingerprint (the input scheme) keyed with a server
// secret: HMAC-SHA-256 with key over the same bytes (the flow name, 0x00,
// the canonical JSON of params). A stored fingerprint of a low-entropy input
// (a card number, a phone number) can be inverted by trying every value,
// which takes minutes for an unkeyed hash; without the key it cannot be.
// Config.FingerprintKey makes the runner key its fingerprints the same way.
// key must be at least MinFingerprintKeyLength bytes.
func FingerprintHMAC(key []byte, flow string, params []byte) ([]byte, error) {
	if len(key) < MinFingerprintKeyLength {
		return nil, errors.New("idem: a fingerprint key must be at least 32 bytes")
	}
	return fingerprintWith(key, flow, params)
}

// fingerprintWith is FingerprintHMAC with key, or Fingerprint without one.
func fingerprintWith(key []byte, flow string, params []byte) ([]byte, error) {
	return hashPooled(nil, key, func(buf []byte) ([]byte, error) {
		return canonical.Append(append(append(buf, flow...), 0), params)
	})
}

// Fingerprint identifies a request by what it asks for, so that a key reused
// for a different request is caught (and answered 422) instead of replaying a
// response that belongs to another payload. It is the 32-byte fingerprint of
// the input scheme, which keys written before the payload scheme carry (the
// runner now fingerprints what the client sent, Request.Payload, with the
// flow and Request.Target, into 33 bytes that start with the scheme byte 2,
// over the same canonical JSON). It is SHA-256 over the flow name,
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
	return fingerprintWith(nil, flow, params)
}

// hashPooled appends to out the SHA-256 (HMAC-SHA-256 under key, when it is
// set) of the bytes build appends to a buffer from a pool: the canonical
// bytes are written straight after their prefix there, never copied, and the
// hash needs no streaming state. An error of build wraps ErrInvalidParams.
func hashPooled(out, key []byte, build func(buf []byte) ([]byte, error)) ([]byte, error) {
	bufp := fingerprintBuffers.Get().(*[]byte) //nolint:forcetypeassert // the pool only holds *[]byte
	defer func() {
		if cap(*bufp) <= fingerprintMaxBuffer {
			fingerprintBuffers.Put(bufp)
		}
	}()
	buf, err := build((*bufp)[:0])
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidParams, err)
	}
	*bufp = buf
	if len(key) == 0 {
		sum := sha256.Sum256(buf)
		return append(out, sum[:]...), nil
	}
	mac := hmac.New(sha256.New, key)
	mac.Write(buf)
	return mac.Sum(out), nil
}

// fingerprintMaxBuffer is the largest buffer returned to the pool, so that
// one huge request does not pin its memory for the life of the process.
const fingerprintMaxBuffer = 1 << 20

var fingerprintBuffers = sync.Pool{New: func() any { return new([]byte) }}

// Fingerprint schemes. A key's stored fingerprint says which one made it by
// its length and first byte, so keys written under an earlier scheme keep
// matching their retries after a deploy that changes the scheme.
const (
	// fingerprintSchemeInput (scheme 1) is the 32 bytes of Fingerprint
	// (FingerprintHMAC with a key) over the JSON encoding of the decoded
	// input. Keys created before the payload scheme carry it; a deploy
	// that changed the input type changed it for every earlier request.
	fingerprintSchemeInput = 1
	// fingerprintSchemePayload (scheme 2) is the byte 2 followed by the 32
	// bytes of SHA-256 (HMAC-SHA-256 with a key) over what the client sent:
	// the flow name, 0x00, the request target, 0x00, a format byte ('j'
	// for JSON, 'b' for bytes) and the payload, JSON in its canonical form
	// (canonical.AppendLoose). The decoded input type plays no part in it.
	fingerprintSchemePayload = 2
)

// payloadFingerprint is the scheme-2 fingerprint of a payload (see
// fingerprintSchemePayload); keyed with key when it is set. An error wraps
// ErrInvalidParams.
func payloadFingerprint(key []byte, flow, target string, payload []byte, binary bool) ([]byte, error) {
	out := make([]byte, 1, 1+sha256.Size)
	out[0] = fingerprintSchemePayload
	return hashPooled(out, key, func(buf []byte) ([]byte, error) {
		buf = append(append(append(append(buf, flow...), 0), target...), 0)
		if binary {
			return append(append(buf, 'b'), payload...), nil
		}
		return canonical.AppendLoose(append(buf, 'j'), payload)
	})
}
