package pgstore

import (
	"cmp"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"

	"github.com/go-idem/idem/idemdriver"
	"github.com/go-idem/idem/idemtype"
)

// ErrCannotOpen is returned for a sealed value the store cannot open: the
// keyring lacks the key the row names (or the store has no keyring), or the
// value does not authenticate. The request fails; nothing is replayed.
var ErrCannotOpen = errors.New("pgstore: cannot open a sealed value")

// The first byte of every sealed value is its format: the layout of the
// rest is a 12-byte nonce, then the AES-GCM ciphertext and tag for both;
// they differ in what the value is bound to (see sealer). A value's format
// byte is not authenticated by itself, but it picks the binding: a value
// relabelled with the other format does not authenticate.
const (
	sealV1 = 1 // v0.1: params bound to scope and key, a body to its row id
	sealV2 = 2 // see paramsAAD and bodyAAD
)

// A keyring (Config.Keyring) seals what the store keeps of a request at
// rest: its params (the stored input) and its response body, with AES-256-GCM
// from the standard library. Each row names the key its values were sealed
// with (params_key_id, response_key_id), so keys rotate: make a new key
// Current and keep the old ones in Keys until no row names them
//
//	SELECT count(*) FROM idem_keys WHERE params_key_id = 'old' OR response_key_id = 'old'
//
// (every row written before the rotation is gone once Retention and
// UnfinishedRetention have passed). A row whose key is missing, or whose sealed value
// does not authenticate under it (a wrong key, tampering, a value moved from
// another row), fails with ErrCannotOpen: it is never replayed.
//
// What a sealed value is bound to (its additional authenticated data): a
// response body to its row (id and generation), flow, the id of the key that
// sealed it, the recovery point it finished at, and the response's status
// and stored headers, so none of them can be changed under an intact body;
// params to the request they were stored for (scope, key, flow and payload
// fingerprint), so params sealed for another request, another key's or an
// earlier generation's, do not open. (The row's id and generation do not
// exist yet when params are sealed: the statement that stores them assigns
// them; the payload fingerprint identifies the request as well.) Rows sealed
// by v0.1 (sealed format 1) stay readable, bound as v0.1 bound them (params
// to scope and key, a body to its row id) until they expire.
//
// With a keyring, every row must be sealed: a value in the clear in a sealed
// column (params without params_key_id, a finished key's body without
// response_key_id) fails with ErrCannotOpen, never replayed nor run, for a
// row in the clear is what anyone who can write the table could put there in
// place of a sealed one. Set the keyring's AcceptUnkeyed while rows written
// before it was configured remain.
//
// Response headers, checkpoint data, last_error and the key's metadata
// (scope, key, flow, path, fingerprint) are not sealed: keep personal and
// payment data out of them (see docs/operations.md, Data and retention).
//
// sealer seals and opens with a keyring.
type sealer struct {
	current string
	aeads   map[string]cipher.AEAD
	// acceptUnsealed is the keyring's AcceptUnkeyed.
	acceptUnsealed bool
}

func newSealer(k *idemtype.Keyring) (*sealer, error) {
	if k == nil {
		return nil, nil
	}
	// AES-256 takes 32-byte keys, exactly.
	if err := k.Check(32, 32); err != nil {
		return nil, fmt.Errorf("pgstore: Keyring: %w", err)
	}
	s := &sealer{current: k.Current, aeads: map[string]cipher.AEAD{}, acceptUnsealed: k.AcceptUnkeyed}
	for id, key := range k.Keys {
		block, err := aes.NewCipher(key)
		if err != nil {
			return nil, fmt.Errorf("pgstore: Keyring: key %q: %w", id, err)
		}
		if s.aeads[id], err = cipher.NewGCM(block); err != nil {
			return nil, fmt.Errorf("pgstore: Keyring: key %q: %w", id, err)
		}
	}
	return s, nil
}

// seal returns plain sealed with the current key in format 2, bound to
// aad(key id), and the key's id.
func (s *sealer) seal(plain []byte, aad func(keyID string) []byte) (string, []byte, error) {
	aead := s.aeads[s.current]
	out := make([]byte, 1+aead.NonceSize(), 1+aead.NonceSize()+len(plain)+aead.Overhead())
	out[0] = sealV2
	if _, err := rand.Read(out[1:]); err != nil {
		return "", nil, fmt.Errorf("pgstore: seal: %w", err)
	}
	return s.current, aead.Seal(out, out[1:], plain, aad(s.current)), nil
}

// open returns the plain value of sealed, which names key id; aad is what
// it is bound to in each format.
func (s *sealer) open(id string, sealed []byte, aad map[byte][]byte) ([]byte, error) {
	if s == nil {
		return nil, fmt.Errorf("%w: it is sealed with key %q, and the store has no keyring (Config.Keyring)", ErrCannotOpen, id)
	}
	aead, ok := s.aeads[id]
	if !ok {
		return nil, fmt.Errorf("%w: it is sealed with key %q, which the keyring does not hold", ErrCannotOpen, id)
	}
	n := aead.NonceSize()
	if len(sealed) < 1+n || aad[sealed[0]] == nil {
		return nil, fmt.Errorf("%w: not a sealed value (key %q)", ErrCannotOpen, id)
	}
	plain, err := aead.Open(nil, sealed[1:1+n], sealed[1+n:], aad[sealed[0]])
	if err != nil {
		return nil, fmt.Errorf("%w: it does not authenticate under key %q (a wrong key, or the row was altered)", ErrCannotOpen, id)
	}
	return plain, nil
}

// fields appends each field length-prefixed, so that no two lists of
// fields run together into the same bytes.
func fields(b []byte, fs ...[]byte) []byte {
	for _, f := range fs {
		b = strconv.AppendInt(b, int64(len(f)), 10)
		b = append(b, ':')
		b = append(b, f...)
	}
	return b
}

// paramsAADv1 and bodyAADv1 are what format 1 bound params and a body to.
func paramsAADv1(scope, key string) []byte {
	return fmt.Appendf(nil, "idem params %d:%s %d:%s", len(scope), scope, len(key), key)
}

func bodyAADv1(id int64) []byte { return []byte("idem response_body " + strconv.FormatInt(id, 10)) }

// paramsAAD binds sealed params to the request they were stored for: its
// scope, key, flow and payload fingerprint.
func paramsAAD(scope, key, flow string, payloadFingerprint []byte) []byte {
	return fields([]byte("idem params 2 "), []byte(scope), []byte(key), []byte(flow), payloadFingerprint)
}

// bodyAAD binds a sealed response body to its row (id, generation), its
// flow, the keyring key that sealed it, the recovery point the key finished
// at, and the status and headers stored with it: what a replay sends, or
// decides by, besides the body.
func bodyAAD(id int64, generation int, flow, keyID, recoveryPoint string, status int, header http.Header) ([]byte, error) {
	headerJSON := []byte("{}")
	if len(header) > 0 {
		var err error
		// encoding/json sorts a map's keys: one header, one encoding.
		if headerJSON, err = json.Marshal(header); err != nil {
			return nil, fmt.Errorf("pgstore: encode response header: %w", err)
		}
	}
	return fields([]byte("idem response_body 2 "), strconv.AppendInt(nil, id, 10), strconv.AppendInt(nil, int64(generation), 10),
		[]byte(flow), []byte(keyID), []byte(recoveryPoint), strconv.AppendInt(nil, int64(status), 10), headerJSON), nil
}

// sealBody seals the response p stores, bound to its row and answer (see
// bodyAAD), and returns it with the id of the key that sealed it.
func (s *sealer) sealBody(p idemdriver.CommitParams) (string, []byte, error) {
	resp := p.Response
	var aadErr error
	id, sealed, err := s.seal(resp.Body, func(keyID string) []byte {
		aad, err := bodyAAD(p.Ref.ID, p.Generation, p.Flow, keyID, cmp.Or(p.RecoveryPoint, idemtype.RecoveryPointFinished), resp.Status, resp.Header)
		aadErr = err
		return aad
	})
	if err == nil {
		err = aadErr
	}
	return id, sealed, err
}

// sealParams returns the params of the request p to store and the id of
// the key that sealed them ("" for the clear, when the store has no
// keyring).
func (s *Store) sealParams(p idemdriver.AcquireParams) (json.RawMessage, string, error) {
	if s.seal == nil {
		return p.Params, "", nil
	}
	// A new key stores the first fingerprint (AcquireParams.Fingerprints),
	// which open reads back as KeyRecord.Fingerprint.
	var fp []byte
	if len(p.Fingerprints) > 0 {
		fp = p.Fingerprints[0]
	}
	id, sealed, err := s.seal.seal(p.Params, func(string) []byte { return paramsAAD(p.Scope, p.Key, p.Flow, fp) })
	if err != nil {
		return nil, "", err
	}
	js, err := json.Marshal(base64.StdEncoding.EncodeToString(sealed))
	return js, id, err
}

// open replaces rec's sealed params and response body with their plain
// values; ErrCannotOpen when it cannot. Params that were not read (a finished
// key's, from the acquisition) are left as they are: nil.
func (s *Store) open(rec *idemtype.KeyRecord) error {
	if s.seal != nil && !s.seal.acceptUnsealed {
		switch {
		case rec.ParamsKeyID == "" && rec.Params != nil:
			return fmt.Errorf("%w: the params of key %d are stored in the clear, and the store seals (Keyring.AcceptUnkeyed is off): refused", ErrCannotOpen, rec.ID)
		case rec.ResponseKeyID == "" && rec.Status == idemtype.StoredFinished && (rec.ResponseBody != nil || rec.ResponseHeaders != nil):
			// A statement that reads the response reads its headers as a
			// map ('{}' when none), so a finished key whose body was made
			// NULL is refused too; one that does not (a listing without
			// the payload) leaves both nil.
			return fmt.Errorf("%w: the response of key %d is stored in the clear, and the store seals (Keyring.AcceptUnkeyed is off): refused", ErrCannotOpen, rec.ID)
		}
	}
	if rec.ParamsKeyID != "" && rec.Params != nil {
		var text string
		if err := json.Unmarshal(rec.Params, &text); err != nil {
			return fmt.Errorf("%w: params of key %d: %w", ErrCannotOpen, rec.ID, err)
		}
		sealed, err := base64.StdEncoding.DecodeString(text)
		if err != nil {
			return fmt.Errorf("%w: params of key %d: %w", ErrCannotOpen, rec.ID, err)
		}
		aad := map[byte][]byte{sealV1: paramsAADv1(rec.Scope, rec.Key), sealV2: paramsAAD(rec.Scope, rec.Key, rec.Flow, rec.Fingerprint)}
		if rec.Params, err = s.seal.open(rec.ParamsKeyID, sealed, aad); err != nil {
			return fmt.Errorf("params of key %d: %w", rec.ID, err)
		}
	}
	if rec.ResponseKeyID != "" {
		v2, err := bodyAAD(rec.ID, rec.Generation, rec.Flow, rec.ResponseKeyID, rec.RecoveryPoint, rec.ResponseStatus, rec.ResponseHeaders)
		if err != nil {
			return err
		}
		plain, err := s.seal.open(rec.ResponseKeyID, rec.ResponseBody, map[byte][]byte{sealV1: bodyAADv1(rec.ID), sealV2: v2})
		if err != nil {
			return fmt.Errorf("response body of key %d: %w", rec.ID, err)
		}
		rec.ResponseBody = plain
	}
	return nil
}

// Sealed reports whether the store seals what it keeps at rest (Config.Keyring).
func (s *Store) Sealed() bool { return s.seal != nil }
