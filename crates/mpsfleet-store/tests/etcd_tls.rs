//! The etcd store over TLS with client certificates: a private etcd member (Debian's
//! `etcd-server`) started here with `--client-cert-auth`, certificates made for it by rcgen.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use mpsfleet_store::etcd::Writers;
use mpsfleet_store::{EtcdConfig, EtcdStore, Op, Precondition, Store, StoreError};
use rcgen::{BasicConstraints, CertificateParams, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, SanType};

struct Member(Child);

impl Drop for Member {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr").port()
}

fn leaf(issuer: &Issuer<'_, KeyPair>, usage: Vec<ExtendedKeyUsagePurpose>) -> (String, String) {
    let key = KeyPair::generate().expect("key");
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
    params.subject_alt_names = vec![SanType::IpAddress("127.0.0.1".parse().expect("ip"))];
    params.extended_key_usages = usage;
    let cert = params.signed_by(&key, issuer).expect("sign");
    (cert.pem(), key.serialize_pem())
}

#[test]
fn the_store_talks_to_an_etcd_that_requires_client_certificates() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ca_key = KeyPair::generate().expect("ca key");
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("params");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = ca_params.self_signed(&ca_key).expect("ca");
    let issuer = Issuer::new(ca_params, ca_key);
    // etcd's JSON gateway dials its own member with the server certificate, so with
    // --client-cert-auth that certificate must allow client authentication too.
    let (server_cert, server_key) =
        leaf(&issuer, vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth]);
    let (client_cert, client_key) = leaf(&issuer, vec![ExtendedKeyUsagePurpose::ClientAuth]);
    let write = |name: &str, text: &str| {
        let p = dir.path().join(name);
        std::fs::write(&p, text).expect("write");
        p
    };
    let ca_file = write("ca.pem", &ca.pem());
    let (cert_file, key_file) = (write("server.pem", &server_cert), write("server.key", &server_key));
    let (client, peer) = (free_port(), free_port());
    let _member = Member(
        Command::new("etcd")
            .args(["--name", "tls", "--data-dir"])
            .arg(dir.path().join("data"))
            .args(["--listen-client-urls", &format!("https://127.0.0.1:{client}")])
            .args(["--advertise-client-urls", &format!("https://127.0.0.1:{client}")])
            .args(["--listen-peer-urls", &format!("http://127.0.0.1:{peer}")])
            .args(["--initial-advertise-peer-urls", &format!("http://127.0.0.1:{peer}")])
            .args(["--initial-cluster", &format!("tls=http://127.0.0.1:{peer}")])
            .arg("--client-cert-auth")
            .arg("--trusted-ca-file")
            .arg(&ca_file)
            .arg("--cert-file")
            .arg(&cert_file)
            .arg("--key-file")
            .arg(&key_file)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start etcd (Debian's etcd-server)"),
    );
    let mut config = EtcdConfig::new(&format!("https://127.0.0.1:{client}"));
    config.prefix = "/tls-test".into();
    config.ca_pem = Some(ca.pem().into_bytes());
    config.identity_pem = Some(format!("{client_cert}\n{client_key}").into_bytes());
    let mut opened = Err(None);
    for _ in 0..100 {
        match EtcdStore::open(&config, Writers::Anyone) {
            Ok(s) => {
                opened = Ok(s);
                break;
            }
            Err(e) => {
                opened = Err(Some(e));
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
    let store =
        opened.unwrap_or_else(|e| panic!("the store must open over TLS with a client certificate: {e:?}"));
    store.commit(&[Op::put("task", "t1", "v", Precondition::Absent)]).expect("commit over TLS");
    let again = EtcdStore::open(&config, Writers::Anyone).expect("open again");
    assert_eq!(again.get("task", "t1").expect("get").expect("t1").value, b"v");

    // Without a client certificate etcd refuses the connection.
    let mut anonymous = config.clone();
    anonymous.identity_pem = None;
    match EtcdStore::open(&anonymous, Writers::Anyone) {
        Err(StoreError::Backend { message, .. }) => assert!(message.contains("etcd"), "{message}"),
        Err(other) => panic!("expected a backend error, got {other}"),
        Ok(_) => panic!("etcd must refuse a client without a certificate"),
    }
    // Nor does the store trust an etcd whose certificate another CA signed.
    let mut untrusting = config.clone();
    let other_key = KeyPair::generate().expect("key");
    let mut other = CertificateParams::new(Vec::<String>::new()).expect("params");
    other.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    untrusting.ca_pem = Some(other.self_signed(&other_key).expect("other ca").pem().into_bytes());
    assert!(
        EtcdStore::open(&untrusting, Writers::Anyone).is_err(),
        "an etcd of another CA must not be trusted"
    );
}
