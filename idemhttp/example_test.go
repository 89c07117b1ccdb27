package idemhttp_test

import (
	"context"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/idemhttp"
	"github.com/go-idem/idem/migrations"
	"github.com/go-idem/idem/pgstore"
)

// A flow served on http.ServeMux: the first POST runs it, a retry with the
// same key replays the stored response, and the same key with another body
// is refused.
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, exampleDatabaseURL()) // in a service: os.Getenv("DATABASE_URL")
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	if m, err := migrations.New(pool, nil); err != nil {
		log.Fatal(err)
	} else if _, err := m.Up(ctx); err != nil {
		log.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE rides (id bigserial PRIMARY KEY, user_email text NOT NULL, origin text NOT NULL)`); err != nil {
		log.Fatal(err)
	}

	type rideRequest struct {
		UserEmail string `json:"user_email"` // from authentication, set by Prepare
		Origin    string `json:"origin"`
	}
	flow := idem.MustNewFlow("rides.create", []idem.Phase[rideRequest]{{
		Name: "ride_created",
		Do: func(ctx context.Context, tx idem.Tx, run *idem.Attempt[rideRequest]) (idem.Result, error) {
			in := run.Input()
			var id int64
			err := tx.QueryRow(ctx, `INSERT INTO rides (user_email, origin) VALUES ($1, $2) RETURNING id`,
				in.UserEmail, in.Origin).Scan(&id)
			if err != nil {
				return idem.Result{}, err
			}
			return idem.RespondJSON(http.StatusCreated, map[string]any{"ride_id": id, "origin": in.Origin}), nil
		},
	}}, nil)

	store, err := pgstore.New(pool, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	runner, err := idem.NewRunner(store, &idem.Config{Flows: []idem.AnyFlow{flow}})
	if err != nil {
		log.Fatal(err)
	}
	userEmail := func(r *http.Request) string {
		email, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		return email
	}
	rides, err := idemhttp.New(runner, flow, &idemhttp.Config[rideRequest]{
		Scope: func(r *http.Request) (string, error) {
			if userEmail(r) == "" {
				return "", idemhttp.ErrUnauthenticated
			}
			return "user:" + userEmail(r), nil
		},
		Prepare: func(r *http.Request, in *rideRequest) error {
			in.UserEmail = userEmail(r)
			return nil
		},
		Validate: func(in *rideRequest) []idemhttp.FieldError {
			if in.Origin == "" {
				return []idemhttp.FieldError{{Field: "origin", Detail: "is required"}}
			}
			return nil
		},
	})
	if err != nil {
		log.Fatal(err)
	}

	mux := http.NewServeMux()
	mux.Handle("POST /rides", rides)
	srv := httptest.NewServer(mux)
	defer srv.Close()

	post := func(key, body string) {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/rides", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer alice@example.com")
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", key)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			log.Fatal(err)
		}
		defer res.Body.Close()
		resBody, _ := io.ReadAll(res.Body)
		fmt.Println(res.StatusCode, res.Header.Get("Content-Type"), "replayed:", res.Header.Get("Idempotent-Replayed") == "true")
		fmt.Println(string(resBody))
	}
	post(`"8e03978e-40d5-43e8-bc93-6894a57f9324"`, `{"origin": "SFO"}`)
	post(`"8e03978e-40d5-43e8-bc93-6894a57f9324"`, `{"origin": "SFO"}`)
	post(`"8e03978e-40d5-43e8-bc93-6894a57f9324"`, `{"origin": "OAK"}`)

	// Output:
	// 201 application/json replayed: false
	// {"origin":"SFO","ride_id":1}
	// 201 application/json replayed: true
	// {"origin":"SFO","ride_id":1}
	// 422 application/problem+json replayed: false
	// {"type":"https://github.com/go-idem/idem/blob/main/docs/http.md#idempotency-key-reused","title":"Idempotency-Key is already used","status":422,"detail":"This Idempotency-Key was already used for a different request (another endpoint or other parameters). Use a new key for a new request, and the same key only to retry the same request."}
}
