package idem

import (
	"crypto/hmac"
	"crypto/sha256"
	"fmt"
	"sync"

	"github.com/go-idem/idem/internal/canonical"
)

// MinFingerprintKeyLength is the shortest key of Config.FingerprintKeys
// accepted: 32 bytes, as much as the hash.
const MinFingerprintKeyLength = 32

// fingerprintScheme is the first byte of every fingerprint: a request's
// fingerprint is the byte 2 followed by the 32 bytes of SHA-256
// (HMAC-SHA-256 with a fingerprint key) over what the client sent: the flow
// name, 0x00, the request target, 0x00, a format byte ('j' for JSON, 'b' for
// bytes) and the payload, JSON in its canonical form (RFC 8785 style, with
// numbers kept exact: key order, whitespace, escapes and the spelling of
// numbers do not change it, any change of value does). The decoded input
// type plays no part in it, so a deploy that changes the flow's input type
// does not change it. (v0.1.0's fingerprints, over the decoded input, were
// 32 bytes without a scheme byte; see idemtype.KeyRecord.FromV01.)
//
// The encoding is unambiguous: a flow name has no 0x00, and the target ends
// at the first 0x00 after it (a request target has no 0x00 either).
const fingerprintScheme = 2

// fingerprints returns the fingerprint of a payload (see fingerprintScheme)
// under each of keys, in order (a nil key: unkeyed SHA-256): the request's
// fingerprint under the current key first, then under the keys used before
// it. No keys is one unkeyed fingerprint. The payload is canonicalised once.
// An error wraps ErrInvalidParams.
func fingerprints(keys [][]byte, flow, target string, payload []byte, binary bool) ([][]byte, error) {
	if len(keys) == 0 {
		keys = [][]byte{nil}
	}
	bufp := fingerprintBuffers.Get().(*[]byte) //nolint:forcetypeassert // the pool only holds *[]byte
	defer func() {
		if cap(*bufp) <= fingerprintMaxBuffer {
			fingerprintBuffers.Put(bufp)
		}
	}()
	buf := append(append(append(append((*bufp)[:0], flow...), 0), target...), 0)
	if binary {
		buf = append(append(buf, 'b'), payload...)
	} else {
		var err error
		if buf, err = canonical.Append(append(buf, 'j'), payload); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrInvalidParams, err)
		}
	}
	*bufp = buf
	out := make([][]byte, len(keys))
	for i, key := range keys {
		fp := make([]byte, 1, 1+sha256.Size)
		fp[0] = fingerprintScheme
		if len(key) == 0 {
			sum := sha256.Sum256(buf)
			out[i] = append(fp, sum[:]...)
			continue
		}
		mac := hmac.New(sha256.New, key)
		mac.Write(buf)
		out[i] = mac.Sum(fp)
	}
	return out, nil
}

// fingerprintMaxBuffer is the largest buffer returned to the pool, so that
// one huge request does not pin its memory for the life of the process.
const fingerprintMaxBuffer = 1 << 20

var fingerprintBuffers = sync.Pool{New: func() any { return new([]byte) }}

// fingerprintKeys are the keys a request is fingerprinted with: the current
// one (nil: unkeyed), then the earlier ones (the keyring's others, and
// unkeyed with its AcceptUnkeyed).
func (c *Config) fingerprintKeys() [][]byte {
	k := c.FingerprintKeys
	if k == nil {
		return [][]byte{nil}
	}
	keys := make([][]byte, 0, 1+len(k.Keys))
	for _, id := range k.IDs() {
		keys = append(keys, k.Keys[id])
	}
	if k.AcceptUnkeyed {
		keys = append(keys, nil)
	}
	return keys
}
