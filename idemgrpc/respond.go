package idemgrpc

import (
	"errors"
	"fmt"
	"mime"
	"net/http"

	"google.golang.org/genproto/googleapis/rpc/code"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/go-idem/idem"
)

// ContentType is the media type of a response stored by [Respond] and
// [RespondStatus]: a binary protobuf message, whose full name is the
// media type's messageType parameter.
const ContentType = "application/x-protobuf"

// statusMessageName is the stored type of an error status.
const statusMessageName = "google.rpc.Status"

var deterministic = proto.MarshalOptions{Deterministic: true}

// Respond ends a flow with msg, the method's response message: it is
// stored with the phase's commit, sent with status OK, and replayed to every
// retry. msg must be of the method's response type.
//
// It returns the phase's two results, so a phase can end with
//
//	return idemgrpc.Respond(&ridespb.Ride{RideId: id, ChargeId: chargeID})
//
// The error is non-nil only when msg cannot be encoded (nil, or a string
// field that is not UTF-8); the phase then fails and stores nothing.
func Respond(msg proto.Message) (idem.Result, error) {
	if !validMessage(msg) {
		return idem.Result{}, errors.New("idemgrpc: Respond needs a message")
	}
	body, err := deterministic.Marshal(msg)
	if err != nil {
		return idem.Result{}, fmt.Errorf("idemgrpc: encode %s: %w", msg.ProtoReflect().Descriptor().FullName(), err)
	}
	name := string(msg.ProtoReflect().Descriptor().FullName())
	return idem.Respond(http.StatusOK, storedHeader(name), body), nil
}

// RespondStatus ends a flow with an error status: a final answer such as a
// declined card (codes.FailedPrecondition), stored with the phase's commit
// and replayed to every retry with the same code, message and details, like
// a response message. st must not be OK.
//
// A stored status is final: every retry gets it. For a failure the client
// should retry (a provider that timed out), return an error from the phase
// instead; nothing is stored and the retry resumes.
func RespondStatus(st *status.Status) (idem.Result, error) {
	if st == nil || st.Code() == codes.OK {
		return idem.Result{}, errors.New("idemgrpc: RespondStatus needs an error status; respond OK with Respond")
	}
	body, err := deterministic.Marshal(st.Proto())
	if err != nil {
		return idem.Result{}, fmt.Errorf("idemgrpc: encode status: %w", err)
	}
	return idem.Respond(HTTPStatus(st.Code()), storedHeader(statusMessageName), body), nil
}

func storedHeader(messageType string) http.Header {
	return http.Header{"Content-Type": {ContentType + `; messageType="` + messageType + `"`}}
}

// decodeStored turns a stored response back into the message or status it
// was made from. want is the method's response type.
func decodeStored[Resp proto.Message](resp *idem.Response, want string) (Resp, *status.Status, error) {
	var zero Resp
	if resp == nil {
		return zero, nil, errors.New("the outcome has no response")
	}
	mediaType, params, err := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	if err != nil || mediaType != ContentType {
		return zero, nil, fmt.Errorf("the stored response is %q, not a protobuf message: did a phase respond with idem.Respond instead of idemgrpc.Respond?",
			resp.Header.Get("Content-Type"))
	}
	stored := params["messagetype"]
	if resp.Status == http.StatusOK {
		if stored != want {
			return zero, nil, fmt.Errorf("the stored response is a %s, but the method answers %s", stored, want)
		}
		msg, err := newMessage[Resp]()
		if err != nil {
			return zero, nil, err
		}
		if err := proto.Unmarshal(resp.Body, msg); err != nil {
			return zero, nil, fmt.Errorf("decode the stored %s: %w", want, err)
		}
		return msg, nil, nil
	}
	if stored != statusMessageName {
		return zero, nil, fmt.Errorf("the stored response has status %d but is a %s, not a %s", resp.Status, stored, statusMessageName)
	}
	var p spb.Status
	if err := proto.Unmarshal(resp.Body, &p); err != nil {
		return zero, nil, fmt.Errorf("decode the stored status: %w", err)
	}
	st := status.FromProto(&p)
	if st.Code() == codes.OK {
		return zero, nil, errors.New("the stored status is OK")
	}
	return zero, st, nil
}

// HTTPStatus is the HTTP status code stored with a response for a gRPC code,
// after the mapping in google/rpc/code.proto. idem keeps it with the key so
// that operators listing keys (the idem CLI, the key table) see at a glance
// what a request answered; clients never see it.
func HTTPStatus(c codes.Code) int {
	switch code.Code(c) {
	case code.Code_OK:
		return http.StatusOK
	case code.Code_CANCELLED:
		return 499
	case code.Code_INVALID_ARGUMENT, code.Code_FAILED_PRECONDITION, code.Code_OUT_OF_RANGE:
		return http.StatusBadRequest
	case code.Code_DEADLINE_EXCEEDED:
		return http.StatusGatewayTimeout
	case code.Code_NOT_FOUND:
		return http.StatusNotFound
	case code.Code_ALREADY_EXISTS, code.Code_ABORTED:
		return http.StatusConflict
	case code.Code_PERMISSION_DENIED:
		return http.StatusForbidden
	case code.Code_UNAUTHENTICATED:
		return http.StatusUnauthorized
	case code.Code_RESOURCE_EXHAUSTED:
		return http.StatusTooManyRequests
	case code.Code_UNIMPLEMENTED:
		return http.StatusNotImplemented
	case code.Code_UNAVAILABLE:
		return http.StatusServiceUnavailable
	}
	return http.StatusInternalServerError // UNKNOWN, INTERNAL, DATA_LOSS and codes not defined yet
}
