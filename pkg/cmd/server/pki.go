package server

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	certutil "k8s.io/client-go/util/cert"
	"k8s.io/client-go/util/keyutil"
)

// pki is the standalone mode's certificate set, kept under <data-dir>/pki so
// that the kubeconfig stays valid across restarts.
type pki struct {
	dir string
}

// File names inside the pki directory.
const (
	caCertFile     = "ca.crt"
	caKeyFile      = "ca.key"
	servingCert    = "serving.crt"
	servingKey     = "serving.key"
	adminCertFile  = "admin.crt"
	adminKeyFile   = "admin.key"
	certValidity   = 365 * 24 * time.Hour
	adminUserName  = "cached-apiserver-admin"
	mastersGroup   = "system:masters"
	kubeconfigUser = "admin"
)

func (p pki) path(name string) string { return filepath.Join(p.dir, name) }

// ensure creates the CA, the serving certificate and the admin client
// certificate, unless all of them exist already.
func (p pki) ensure(hosts []string, ips []net.IP) error {
	if exists(p.path(caCertFile)) && exists(p.path(servingCert)) && exists(p.path(adminCertFile)) {
		return nil
	}
	if err := os.MkdirAll(p.dir, 0o700); err != nil {
		return err
	}
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	caCert, err := certutil.NewSelfSignedCACert(certutil.Config{CommonName: "cached-apiserver-ca"}, caKey)
	if err != nil {
		return err
	}
	if err := writeCertKey(p.path(caCertFile), p.path(caKeyFile), caCert, caKey); err != nil {
		return err
	}
	serving := &x509.Certificate{
		Subject:     pkix.Name{CommonName: "cached-apiserver"},
		DNSNames:    hosts,
		IPAddresses: ips,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	if err := p.sign(serving, caCert, caKey, servingCert, servingKey); err != nil {
		return err
	}
	admin := &x509.Certificate{
		Subject:     pkix.Name{CommonName: adminUserName, Organization: []string{mastersGroup}},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	return p.sign(admin, caCert, caKey, adminCertFile, adminKeyFile)
}

// sign issues tmpl under the CA and writes the certificate and a new key.
func (p pki) sign(tmpl, ca *x509.Certificate, caKey crypto.Signer, certName, keyName string) error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		return err
	}
	tmpl.SerialNumber = serial
	tmpl.NotBefore = time.Now().Add(-time.Minute)
	tmpl.NotAfter = time.Now().Add(certValidity)
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, key.Public(), caKey)
	if err != nil {
		return err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return err
	}
	return writeCertKey(p.path(certName), p.path(keyName), cert, key)
}

// writeKubeconfig writes a kubeconfig that verifies the server against the
// CA and authenticates with the admin client certificate.
func (p pki) writeKubeconfig(path, serverURL string) error {
	ca, err := os.ReadFile(p.path(caCertFile))
	if err != nil {
		return err
	}
	cert, err := os.ReadFile(p.path(adminCertFile))
	if err != nil {
		return err
	}
	key, err := os.ReadFile(p.path(adminKeyFile))
	if err != nil {
		return err
	}
	const name = "cached-apiserver"
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters[name] = &clientcmdapi.Cluster{Server: serverURL, CertificateAuthorityData: ca}
	cfg.AuthInfos[kubeconfigUser] = &clientcmdapi.AuthInfo{ClientCertificateData: cert, ClientKeyData: key}
	cfg.Contexts[name] = &clientcmdapi.Context{Cluster: name, AuthInfo: kubeconfigUser, Namespace: "default"}
	cfg.CurrentContext = name
	return clientcmd.WriteToFile(*cfg, path)
}

func writeCertKey(certPath, keyPath string, cert *x509.Certificate, key *ecdsa.PrivateKey) error {
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	if err := keyutil.WriteKey(keyPath, encodePEM(keyutil.ECPrivateKeyBlockType, keyDER)); err != nil {
		return fmt.Errorf("writing %s: %w", keyPath, err)
	}
	return certutil.WriteCert(certPath, encodePEM(certutil.CertificateBlockType, cert.Raw))
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return !errors.Is(err, os.ErrNotExist)
}

func encodePEM(blockType string, der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: blockType, Bytes: der})
}
