// Package level moves gpucr image directories to and from a level that
// outlives the machine: an S3-compatible object store (any: AWS S3,
// SeaweedFS, Ceph's RGW...). An image on a level is its directory's
// files, each stored once per bucket as a blob named by the SHA-256 of its
// bytes (the checkpoints of a series, and jobs that share a bucket, upload
// only what the bucket lacks), and an index that lists them, written last:
// an image is on the level once its index is, and never before.
//
//	s3://BUCKET/.gpucr/blobs/SHA256          every file's bytes, by hash
//	s3://BUCKET/PATH/NAME/.gpucr-index.json  the image PATH/NAME: its files
//
// A pull checks every file it fetches against the size and hash its index
// names before the file takes its place.
package level

import (
	"errors"
	"fmt"
	"net/url"
	"path"
	"strings"
)

// Ref names an image on a level, or (Name "") a place that holds images.
type Ref struct {
	Bucket string
	// Path is the image's key, without leading or trailing slashes:
	// "job/7" for s3://bucket/job/7.
	Path string
}

// String is the reference as a URL.
func (r Ref) String() string {
	if r.Path == "" {
		return "s3://" + r.Bucket
	}
	return "s3://" + r.Bucket + "/" + r.Path
}

// IsURL says whether s names a level (s3://...) rather than a directory.
func IsURL(s string) bool { return strings.HasPrefix(s, "s3://") }

// Parse reads s3://BUCKET[/PATH]. Credentials in the URL are refused
// without being echoed: they come from the environment or a profile.
func Parse(s string) (Ref, error) {
	if !IsURL(s) {
		return Ref{}, fmt.Errorf("%q is not an s3:// URL", s)
	}
	u, err := url.Parse(s)
	if err != nil {
		return Ref{}, errors.New("an s3:// URL that does not parse") // its text may hold a secret
	}
	if u.User != nil {
		return Ref{}, errors.New("an s3:// URL with credentials in it: give them as AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or a profile")
	}
	if u.RawQuery != "" || u.Fragment != "" {
		return Ref{}, fmt.Errorf("s3://%s: no query or fragment is taken", u.Host)
	}
	if !validBucket(u.Host) {
		return Ref{}, fmt.Errorf("s3://%s: not a bucket name (3-63 lower-case letters, digits, dots and hyphens)", u.Host)
	}
	p := strings.Trim(u.Path, "/")
	if p != "" {
		for _, part := range strings.Split(p, "/") {
			if part == "" || part == "." || part == ".." || strings.HasPrefix(part, ".gpucr") {
				return Ref{}, fmt.Errorf("%s: the path part %q is not allowed", Ref{Bucket: u.Host}.String()+"/"+p, part)
			}
		}
		if path.Clean(p) != p {
			return Ref{}, fmt.Errorf("s3://%s/%s: not a clean path", u.Host, p)
		}
	}
	return Ref{Bucket: u.Host, Path: p}, nil
}

func validBucket(b string) bool {
	if len(b) < 3 || len(b) > 63 {
		return false
	}
	for i := 0; i < len(b); i++ {
		c := b[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '.' || c == '-') {
			return false
		}
	}
	return b[0] != '.' && b[0] != '-' && b[len(b)-1] != '.' && b[len(b)-1] != '-'
}

const (
	blobPrefix = ".gpucr/blobs/"
	indexName  = ".gpucr-index.json"
)

func blobKey(sum string) string { return blobPrefix + sum }

func (r Ref) indexKey() string { return r.Path + "/" + indexName }
