package idemgrpc

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// Input is the flow input the adapter builds by default: the full name of the
// method called and the request message. Phases read the request through
// [idem.Attempt.Input]:
//
//	req := a.Input().Message // *ridespb.CreateRideRequest
//
// idem keeps a flow's input as JSON, to fingerprint it and to re-drive an
// unfinished request without its client, so Input encodes to JSON as
//
//	{"method": "/rides.v1.Rides/CreateRide", "message": <the message as protojson>}
//
// with the message in protojson under its proto field names. The key's
// fingerprint is not taken over this JSON but over the request message as
// the client sent it: its deterministic wire encoding, without the fields
// its type does not know, and the method. So the order in which the client
// serialised the fields, unknown fields, and anything else that does not
// change the message's value do not change it; any change of value, and a
// call of another method, do. A deploy that adds a field to the message,
// renames one, or changes the flow's input (Config.Input) does not.
type Input[M proto.Message] struct {
	// Method is the full name of the method called, as in
	// grpc.UnaryServerInfo.FullMethod: "/package.Service/Method".
	Method string
	// Message is the request message.
	Message M
}

// inputJSON is the JSON form of an Input.
type inputJSON struct {
	Method  string          `json:"method"`
	Message json.RawMessage `json:"message"`
}

var (
	marshalJSON   = protojson.MarshalOptions{UseProtoNames: true}
	unmarshalJSON = protojson.UnmarshalOptions{DiscardUnknown: true}
)

// MarshalJSON encodes the input for idem: the method and the message as
// protojson.
func (in Input[M]) MarshalJSON() ([]byte, error) {
	if !validMessage(in.Message) {
		return nil, errors.New("idemgrpc: Input has no message")
	}
	msg, err := marshalJSON.Marshal(in.Message)
	if err != nil {
		return nil, fmt.Errorf("idemgrpc: encode %s as JSON: %w", in.Message.ProtoReflect().Descriptor().FullName(), err)
	}
	return json.Marshal(inputJSON{Method: in.Method, Message: msg})
}

// UnmarshalJSON decodes what MarshalJSON encoded. Fields the message type no
// longer has (a deploy removed them while a request was in flight) are
// ignored.
func (in *Input[M]) UnmarshalJSON(data []byte) error {
	if bytes.Equal(bytes.TrimSpace(data), []byte("null")) {
		return nil
	}
	var raw inputJSON
	if err := json.Unmarshal(data, &raw); err != nil {
		return fmt.Errorf("idemgrpc: decode input: %w", err)
	}
	msg, err := newMessage[M]()
	if err != nil {
		return err
	}
	if len(raw.Message) == 0 {
		return errors.New(`idemgrpc: decode input: no "message"`)
	}
	if err := unmarshalJSON.Unmarshal(raw.Message, msg); err != nil {
		return fmt.Errorf("idemgrpc: decode %s from JSON: %w", msg.ProtoReflect().Descriptor().FullName(), err)
	}
	in.Method, in.Message = raw.Method, msg
	return nil
}

// newMessage returns a new, empty message of the concrete type M.
func newMessage[M proto.Message]() (M, error) {
	var zero M
	if t := reflect.TypeFor[M](); t.Kind() != reflect.Pointer {
		return zero, fmt.Errorf("idemgrpc: %s is not a concrete message type (want a generated message pointer such as *pb.Request)", t)
	}
	m, ok := zero.ProtoReflect().New().Interface().(M)
	if !ok {
		return zero, fmt.Errorf("idemgrpc: %s does not make messages of its own type", reflect.TypeFor[M]())
	}
	return m, nil
}

// messageName returns the full name of the concrete message type M.
func messageName[M proto.Message]() (protoreflect.FullName, error) {
	m, err := newMessage[M]()
	if err != nil {
		return "", err
	}
	return m.ProtoReflect().Descriptor().FullName(), nil
}

// validMessage reports whether m is a message, not nil nor a nil pointer.
func validMessage(m proto.Message) bool {
	if m == nil {
		return false
	}
	if v := reflect.ValueOf(m); v.Kind() == reflect.Pointer && v.IsNil() {
		return false
	}
	return m.ProtoReflect().IsValid()
}

// wirePayload is what the key's fingerprint is taken over: the message's
// deterministic wire encoding, without the fields its type does not know.
// It depends on the message's value alone: not on the order in which the
// client serialised the fields, nor on the flow's input (Config.Input) or
// on the names of the fields, so a deploy that adds a field to the message,
// renames one or changes what Config.Input derives leaves the fingerprint
// of a retry as it was.
func wirePayload(req proto.Message) ([]byte, error) {
	m := proto.Clone(req)
	discardUnknown(m.ProtoReflect())
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("idemgrpc: encode %s: %w", m.ProtoReflect().Descriptor().FullName(), err)
	}
	return b, nil
}

// discardUnknown drops the unknown fields of m and of every message in it.
func discardUnknown(m protoreflect.Message) {
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		switch {
		case fd.IsList() && fd.Message() != nil:
			for i := range v.List().Len() {
				discardUnknown(v.List().Get(i).Message())
			}
		case fd.IsMap() && fd.MapValue().Message() != nil:
			v.Map().Range(func(_ protoreflect.MapKey, mv protoreflect.Value) bool {
				discardUnknown(mv.Message())
				return true
			})
		case fd.Message() != nil && !fd.IsMap():
			discardUnknown(v.Message())
		}
		return true
	})
	if len(m.GetUnknown()) > 0 {
		m.SetUnknown(nil)
	}
}
