package idemtype

import (
	"errors"
	"fmt"
	"regexp"
	"slices"
)

// Keyring is a current secret key and the earlier ones still needed, by id.
// It serves two uses, each with its own rule for a key's length:
//
//   - sealing what a store keeps at rest (pgstore.Config.Keyring): AES-256
//     keys, 32 bytes each. Each row names the key id it was sealed with, so a
//     key rotates by making a new one Current and keeping the old one in Keys
//     until no row names it.
//   - keying request fingerprints (idem.Config.FingerprintKeys): HMAC-SHA-256
//     keys of at least 32 bytes. New keys are fingerprinted with Current; a
//     stored key whose fingerprint is the request's under any key in Keys is
//     that request, so a fingerprint key rotates the same way.
//
// Either way, keep the keys as secret as a password pepper, and keep an old
// key until every value made with it is gone: the longest of idem's
// Retention and UnfinishedRetention (Config and FlowConfig) after the
// rotation.
type Keyring struct {
	// Current is the id of the key new values are made with; it must be in
	// Keys.
	Current string
	// Keys are the keys by id: the current one and every earlier one still
	// needed. An id is 1-64 letters, digits and ._- (a sealing store keeps
	// it with every row).
	Keys map[string][]byte
	// AcceptUnkeyed accepts values made before any key was configured:
	// rows stored in the clear by a store that now seals, fingerprints that
	// are plain SHA-256. Set it together with a first keyring while such
	// values remain, and unset it once they are gone. While it is set,
	// whoever can write the table can put a value in the clear in place of
	// a sealed one. Default false: such a value is refused.
	AcceptUnkeyed bool
}

var keyIDPattern = regexp.MustCompile(`^[A-Za-z0-9._-]{1,64}$`)

// Check reports what is wrong with the keyring for keys that must be
// between minLen and maxLen bytes long (maxLen 0: no upper bound): an id
// outside the pattern, a key of the wrong length, a Current missing from
// Keys. The errors name the keys by id, never by value.
func (k *Keyring) Check(minLen, maxLen int) error {
	var errs []error
	for _, id := range k.IDs() {
		key := k.Keys[id]
		switch {
		case !keyIDPattern.MatchString(id):
			errs = append(errs, fmt.Errorf("key id %q: use 1-64 letters, digits and ._-", id))
		case minLen == maxLen && len(key) != minLen:
			errs = append(errs, fmt.Errorf("key %q is %d bytes; it takes %d", id, len(key), minLen))
		case len(key) < minLen:
			errs = append(errs, fmt.Errorf("key %q is %d bytes, under %d", id, len(key), minLen))
		case maxLen > 0 && len(key) > maxLen:
			errs = append(errs, fmt.Errorf("key %q is %d bytes, over %d", id, len(key), maxLen))
		}
	}
	if _, ok := k.Keys[k.Current]; !ok {
		errs = append(errs, fmt.Errorf("the current key %q is not in Keys", k.Current))
	}
	return errors.Join(errs...)
}

// IDs returns the ids of Keys: Current first, then the others in
// lexical order, so that whatever tries them tries them in one order.
func (k *Keyring) IDs() []string {
	ids := make([]string, 0, len(k.Keys))
	for id := range k.Keys {
		if id != k.Current {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	if _, ok := k.Keys[k.Current]; ok {
		ids = append([]string{k.Current}, ids...)
	}
	return ids
}
