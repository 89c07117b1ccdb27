package pgstore

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strconv"

	"github.com/go-idem/idem/idemdriver"
)

// Keyring holds the keys that seal what the store keeps of a request at
// rest: its params (the stored input) and its response body, with AES-256-GCM
// from the standard library. Each row names the key its values were sealed
// with (params_key_id, response_key_id), so keys rotate: make a new key
// Current and keep the old ones in Keys until no row names them
//
//	SELECT count(*) FROM idem_keys WHERE params_key_id = 'old' OR response_key_id = 'old'
//
// (every row written before the rotation is gone once Retention and
// AbandonAfter have passed). A row whose key is missing, or whose sealed value
// does not authenticate under it (a wrong key, tampering, a value moved from
// another row), fails with ErrCannotOpen: it is never replayed.
//
// Response headers, checkpoint data, last_error and the key's metadata
// (scope, key, flow, path, fingerprint) are not sealed: keep personal and
// payment data out of them (see docs/operations.md, Data and retention).
type Keyring struct {
	// Current is the id of the key new values are sealed with.
	Current string
	// Keys are AES-256 keys (32 bytes each) by id: the current one and
	// every earlier one still needed to open stored rows. An id is 1-64
	// letters, digits and ._- ; it is stored with every row.
	Keys map[string][]byte
}

// ErrCannotOpen is returned for a sealed value the store cannot open: the
// keyring lacks the key the row names (or the store has no keyring), or the
// value does not authenticate. The request fails; nothing is replayed.
var ErrCannotOpen = errors.New("pgstore: cannot open a sealed value")

var keyIDPattern = regexp.MustCompile(`^[A-Za-z0-9._-]{1,64}$`)

// sealVersion is the first byte of every sealed value, the layout of the
// rest: a 12-byte nonce, then the AES-GCM ciphertext and tag.
const sealVersion = 1

// sealer seals and opens with a keyring.
type sealer struct {
	current string
	aeads   map[string]cipher.AEAD
}

func newSealer(k *Keyring) (*sealer, error) {
	if k == nil {
		return nil, nil
	}
	s := &sealer{current: k.Current, aeads: map[string]cipher.AEAD{}}
	for id, key := range k.Keys {
		if !keyIDPattern.MatchString(id) {
			return nil, fmt.Errorf("pgstore: Cipher: key id %q: use 1-64 letters, digits and ._-", id)
		}
		if len(key) != 32 {
			return nil, fmt.Errorf("pgstore: Cipher: key %q is %d bytes; AES-256 takes 32", id, len(key))
		}
		block, err := aes.NewCipher(key)
		if err != nil {
			return nil, fmt.Errorf("pgstore: Cipher: key %q: %w", id, err)
		}
		if s.aeads[id], err = cipher.NewGCM(block); err != nil {
			return nil, fmt.Errorf("pgstore: Cipher: key %q: %w", id, err)
		}
	}
	if _, ok := s.aeads[k.Current]; !ok {
		return nil, fmt.Errorf("pgstore: Cipher: the current key %q is not in Keys", k.Current)
	}
	return s, nil
}

// seal returns plain sealed with the current key, bound to aad, and the
// key's id.
func (s *sealer) seal(plain, aad []byte) (string, []byte, error) {
	aead := s.aeads[s.current]
	out := make([]byte, 1+aead.NonceSize(), 1+aead.NonceSize()+len(plain)+aead.Overhead())
	out[0] = sealVersion
	if _, err := rand.Read(out[1:]); err != nil {
		return "", nil, fmt.Errorf("pgstore: seal: %w", err)
	}
	return s.current, aead.Seal(out, out[1:], plain, aad), nil
}

// open returns the plain value of sealed, which names key id.
func (s *sealer) open(id string, sealed, aad []byte) ([]byte, error) {
	if s == nil {
		return nil, fmt.Errorf("%w: it is sealed with key %q, and the store has no keyring (Config.Cipher)", ErrCannotOpen, id)
	}
	aead, ok := s.aeads[id]
	if !ok {
		return nil, fmt.Errorf("%w: it is sealed with key %q, which the keyring does not hold", ErrCannotOpen, id)
	}
	n := aead.NonceSize()
	if len(sealed) < 1+n || sealed[0] != sealVersion {
		return nil, fmt.Errorf("%w: not a sealed value (key %q)", ErrCannotOpen, id)
	}
	plain, err := aead.Open(nil, sealed[1:1+n], sealed[1+n:], aad)
	if err != nil {
		return nil, fmt.Errorf("%w: it does not authenticate under key %q (a wrong key, or the row was altered)", ErrCannotOpen, id)
	}
	return plain, nil
}

// paramsAAD binds a sealed params to its key's scope and key, and
// bodyAAD a sealed response body to its row, so neither opens elsewhere.
func paramsAAD(scope, key string) []byte {
	return fmt.Appendf(nil, "idem params %d:%s %d:%s", len(scope), scope, len(key), key)
}

func bodyAAD(id int64) []byte { return []byte("idem response_body " + strconv.FormatInt(id, 10)) }

// sealParams returns the params to store and the id of the key that sealed
// them ("" for the clear, when the store has no keyring).
func (s *Store) sealParams(scope, key string, params []byte) (json.RawMessage, string, error) {
	if s.seal == nil {
		return params, "", nil
	}
	id, sealed, err := s.seal.seal(params, paramsAAD(scope, key))
	if err != nil {
		return nil, "", err
	}
	js, err := json.Marshal(base64.StdEncoding.EncodeToString(sealed))
	return js, id, err
}

// open replaces rec's sealed params and response body with their plain
// values; ErrCannotOpen when it cannot. Params that were not read (a finished
// key's, from the acquisition) are left as they are: nil.
func (s *Store) open(rec *idemdriver.KeyRecord) error {
	if rec.ParamsKeyID != "" && rec.Params != nil {
		var text string
		if err := json.Unmarshal(rec.Params, &text); err != nil {
			return fmt.Errorf("%w: params of key %d: %w", ErrCannotOpen, rec.ID, err)
		}
		sealed, err := base64.StdEncoding.DecodeString(text)
		if err != nil {
			return fmt.Errorf("%w: params of key %d: %w", ErrCannotOpen, rec.ID, err)
		}
		if rec.Params, err = s.seal.open(rec.ParamsKeyID, sealed, paramsAAD(rec.Scope, rec.Key)); err != nil {
			return fmt.Errorf("params of key %d: %w", rec.ID, err)
		}
	}
	if rec.ResponseKeyID != "" {
		plain, err := s.seal.open(rec.ResponseKeyID, rec.ResponseBody, bodyAAD(rec.ID))
		if err != nil {
			return fmt.Errorf("response body of key %d: %w", rec.ID, err)
		}
		rec.ResponseBody = plain
	}
	return nil
}
