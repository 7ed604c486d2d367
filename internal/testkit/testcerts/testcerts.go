// Package testcerts makes a certificate authority and certificates signed by it, for
// tests of TLS and mutual TLS against real NATS servers: nothing here is for use
// outside tests (the keys are written unencrypted, the CA lives a day).
package testcerts

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// Files are the PEM files Make wrote.
type Files struct {
	CA                    string // the CA's certificate
	ServerCert, ServerKey string // for 127.0.0.1, ::1 and localhost
	ClientCert, ClientKey string // a client certificate (mutual TLS)
	OtherCA               string // a second CA, which signed nothing above
}

// Make writes a CA, a server and a client certificate signed by it, and an unrelated
// CA, into dir.
func Make(dir string) (Files, error) {
	f := Files{
		CA: filepath.Join(dir, "ca.pem"), ServerCert: filepath.Join(dir, "server.pem"), ServerKey: filepath.Join(dir, "server-key.pem"),
		ClientCert: filepath.Join(dir, "client.pem"), ClientKey: filepath.Join(dir, "client-key.pem"), OtherCA: filepath.Join(dir, "other-ca.pem"),
	}
	ca, caKey, err := makeCA("flow test CA", f.CA)
	if err != nil {
		return f, err
	}
	if _, _, err := makeCA("another CA", f.OtherCA); err != nil {
		return f, err
	}
	server := &x509.Certificate{
		Subject:     pkix.Name{CommonName: "nats test server"},
		DNSNames:    []string{"localhost"},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("::1")},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	if err := makeLeaf(server, ca, caKey, f.ServerCert, f.ServerKey); err != nil {
		return f, err
	}
	clientCert := &x509.Certificate{Subject: pkix.Name{CommonName: "flow test client"}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	return f, makeLeaf(clientCert, ca, caKey, f.ClientCert, f.ClientKey)
}

func template(c *x509.Certificate) *x509.Certificate {
	c.SerialNumber, _ = rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	c.NotBefore = time.Now().Add(-time.Hour)
	c.NotAfter = time.Now().Add(24 * time.Hour)
	return c
}

func makeCA(name, certFile string) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	tmpl := template(&x509.Certificate{Subject: pkix.Name{CommonName: name}, IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature})
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, err
	}
	return cert, key, writePEM(certFile, "CERTIFICATE", der)
}

func makeLeaf(tmpl, ca *x509.Certificate, caKey *ecdsa.PrivateKey, certFile, keyFile string) error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	tmpl = template(tmpl)
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	if err := writePEM(certFile, "CERTIFICATE", der); err != nil {
		return err
	}
	return writePEM(keyFile, "EC PRIVATE KEY", keyDER)
}

func writePEM(path, kind string, der []byte) error {
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o600); err != nil {
		return fmt.Errorf("testcerts: %w", err)
	}
	return nil
}
