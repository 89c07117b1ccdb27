package idemgrpc

import (
	"context"
	"crypto/rand"
	"fmt"

	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/go-idem/idem"
)

// MetadataKey is the request metadata entry that carries the idempotency
// key, the gRPC spelling of the HTTP Idempotency-Key header.
const MetadataKey = "idempotency-key"

// ReplayedHeader is the response header metadata entry set to "true" on
// every replayed answer, a response message or a stored error status alike.
const ReplayedHeader = "idempotent-replayed"

// keySource says where a request's key came from, for error messages and
// the BadRequest details.
type keySource struct {
	field protoreflect.FieldDescriptor // nil when only metadata is read
}

// name is how the client knows where the key goes: the field, or the
// metadata entry.
func (s keySource) name() string {
	if s.field != nil {
		return string(s.field.Name())
	}
	return MetadataKey
}

// where says where the client may put the key.
func (s keySource) where() string {
	if s.field != nil {
		return fmt.Sprintf("the %s field or the %q metadata entry", s.field.Name(), MetadataKey)
	}
	return fmt.Sprintf("the %q metadata entry", MetadataKey)
}

// keyFieldOf finds the configured key field of a request type: a singular
// string field.
func keyFieldOf(desc protoreflect.MessageDescriptor, name string) (protoreflect.FieldDescriptor, error) {
	fd := desc.Fields().ByName(protoreflect.Name(name))
	switch {
	case fd == nil:
		return nil, fmt.Errorf("KeyField: %s has no field %q", desc.FullName(), name)
	case fd.Kind() != protoreflect.StringKind || fd.Cardinality() == protoreflect.Repeated:
		return nil, fmt.Errorf("KeyField: %s.%s is not a singular string field", desc.FullName(), name)
	}
	return fd, nil
}

// requestKey returns the request's idempotency key, from the metadata entry
// or the key field, and reports whether the client sent one. The status is
// an INVALID_ARGUMENT for a malformed key.
func (h *core) requestKey(ctx context.Context, req proto.Message) (string, bool, *status.Status) {
	var key string
	md, _ := metadata.FromIncomingContext(ctx)
	for _, v := range md.Get(MetadataKey) {
		switch {
		case v == "":
			// An empty entry is no key, as an empty header field is.
		case key != "" && v != key:
			return "", true, h.keyMalformed(fmt.Sprintf("The request carries several %q metadata entries; send exactly one key.", MetadataKey), "several keys")
		default:
			key = v
		}
	}
	if h.source.field != nil {
		if v := req.ProtoReflect().Get(h.source.field).String(); v != "" {
			if key != "" && v != key {
				return "", true, h.keyMalformed(fmt.Sprintf("The %q metadata entry and the %s field hold different keys; send one key, or the same in both.",
					MetadataKey, h.source.field.Name()), "differs from the metadata entry")
			}
			key = v
		}
	}
	switch {
	case key == "":
		return "", false, nil
	case !idem.ValidKey(key):
		return "", true, h.keyMalformed(fmt.Sprintf("The idempotency key must be 1 to 255 printable ASCII characters; this one has %d bytes.", len(key)),
			"must be 1 to 255 printable ASCII characters")
	case h.uuidKeys && !isUUID(key):
		return "", true, h.keyMalformed("The idempotency key must be a UUID, such as 8e03978e-40d5-43e8-bc93-6894a57f9324.", "must be a UUID")
	}
	return key, true, nil
}

// isUUID reports whether s is a UUID in its canonical textual form:
// 8-4-4-4-12 hexadecimal digits, either case. The nil UUID is refused, as
// AIP-155 asks: it is what a client that forgot to set the key sends.
func isUUID(s string) bool {
	if len(s) != 36 || s == "00000000-0000-0000-0000-000000000000" {
		return false
	}
	for i := range len(s) {
		c := s[i]
		switch i {
		case 8, 13, 18, 23:
			if c != '-' {
				return false
			}
		default:
			if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F') {
				return false
			}
		}
	}
	return true
}

// serverKey makes up a key for a request sent without one, when keys are
// optional: the request runs like any other but cannot be retried.
func serverKey() string { return "server-" + rand.Text() }
