package idemhttp

import "strconv"

// Profile selects the status codes and error shape of the HTTP contract.
type Profile int

const (
	// ProfileIETF follows draft-ietf-httpapi-idempotency-key-header: a
	// reused key is 422, validation failures are 422. It is the default.
	ProfileIETF Profile = iota

	// ProfileStripe follows Stripe's API: a reused key is 400 with error
	// type idempotency_error, invalid parameters are 400 with
	// invalid_request_error. Problems keep RFC 9457's members and add
	// Stripe's "error" object, so Stripe clients and RFC 9457 clients can
	// both read them.
	ProfileStripe
)

func (p Profile) String() string {
	switch p {
	case ProfileIETF:
		return "ietf"
	case ProfileStripe:
		return "stripe"
	}
	return "Profile(" + strconv.Itoa(int(p)) + ")"
}
