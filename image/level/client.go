package level

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
)

// Options is how to reach the object store.
type Options struct {
	// Endpoint is the store's URL (http://host:port, https://host); "":
	// $AWS_ENDPOINT_URL_S3, else $AWS_ENDPOINT_URL, else AWS S3 itself.
	Endpoint string
	// Profile names the credentials file's profile ("": $AWS_PROFILE, else
	// "default"). Credentials come from $AWS_ACCESS_KEY_ID and
	// $AWS_SECRET_ACCESS_KEY ($AWS_SESSION_TOKEN) first, then that profile
	// of $AWS_SHARED_CREDENTIALS_FILE (~/.aws/credentials), then the
	// instance's role where there is one: the S3 tools' order.
	Profile string
	// Jobs: transfers at once (0: 8).
	Jobs int
}

// Store is a connection to an object store.
type Store struct {
	c    *minio.Client
	host string
	jobs int
	// OnProgress, if set, hears of every file a push has done (from one
	// goroutine at a time).
	OnProgress func(Progress)
}

// Open prepares a client for the store o names. Nothing is asked of the
// store yet; no secret is ever part of an error.
func Open(o Options) (*Store, error) {
	ep := o.Endpoint
	if ep == "" {
		ep = os.Getenv("AWS_ENDPOINT_URL_S3")
	}
	if ep == "" {
		ep = os.Getenv("AWS_ENDPOINT_URL")
	}
	host, secure := "s3.amazonaws.com", true
	lookup := minio.BucketLookupAuto
	if ep != "" {
		u, err := url.Parse(ep)
		if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") || u.User != nil || (u.Path != "" && u.Path != "/") {
			return nil, errors.New("the object store's endpoint must be http://HOST[:PORT] or https://HOST[:PORT]")
		}
		host, secure = u.Host, u.Scheme == "https"
		lookup = minio.BucketLookupPath // a store of one's own: no virtual-host DNS
	}
	profile := o.Profile
	if profile == "" {
		profile = os.Getenv("AWS_PROFILE")
	}
	creds := credentials.NewChainCredentials([]credentials.Provider{
		&credentials.EnvAWS{},
		&credentials.FileAWSCredentials{Profile: profile},
		&credentials.IAM{},
	})
	region := os.Getenv("AWS_REGION")
	if region == "" {
		region = os.Getenv("AWS_DEFAULT_REGION")
	}
	c, err := minio.New(host, &minio.Options{Creds: creds, Secure: secure, Region: region, BucketLookup: lookup})
	if err != nil {
		return nil, fmt.Errorf("object store %s: %w", host, err)
	}
	jobs := o.Jobs
	if jobs <= 0 {
		jobs = 8
	}
	return &Store{c: c, host: host, jobs: jobs}, nil
}

// storeErr says what failed on the store, naming the object and the
// store's own code and message (which carry no secret).
func (s *Store) storeErr(what string, r Ref, key string, err error) error {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("%s s3://%s/%s: %w", what, r.Bucket, key, err)
	}
	var er minio.ErrorResponse
	if errors.As(err, &er) && er.Code != "" {
		msg := er.Message
		if strings.Contains(msg, "Access Key") || er.Code == "InvalidAccessKeyId" || er.Code == "SignatureDoesNotMatch" {
			msg = "the credentials were refused"
		}
		return fmt.Errorf("%s s3://%s/%s on %s: %s (%s)", what, r.Bucket, key, s.host, msg, er.Code)
	}
	return fmt.Errorf("%s s3://%s/%s on %s: %v", what, r.Bucket, key, s.host, scrub(err))
}

// scrub keeps the process's secret key out of an error's text.
func scrub(err error) string {
	msg := err.Error()
	for _, k := range []string{"AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"} {
		if v := os.Getenv(k); len(v) >= 4 {
			msg = strings.ReplaceAll(msg, v, "[redacted]")
		}
	}
	return msg
}

func notFound(err error) bool {
	var er minio.ErrorResponse
	return errors.As(err, &er) && (er.Code == "NoSuchKey" || er.Code == "NotFound" || er.StatusCode == 404)
}
